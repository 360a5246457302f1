-- Back to the version-4 indexes, in one ALTER TABLE run only while
-- blocked_seq exists (safe to run again).
SET @millpond_step = (SELECT IF(COUNT(*) = 1,
    'ALTER TABLE millpond_deliveries
    DROP INDEX millpond_deliveries_next_idx,
    DROP INDEX millpond_deliveries_settled_idx,
    DROP COLUMN blocked_seq,
    ADD KEY millpond_deliveries_delivered_idx (status, delivered_at),
    ADD KEY millpond_deliveries_blocked_idx (stream, consumer_group, ordering_key, status, ordering_seq)',
    'DO 0')
    FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_deliveries' AND COLUMN_NAME = 'blocked_seq');
PREPARE millpond_stmt FROM @millpond_step;
EXECUTE millpond_stmt;
DEALLOCATE PREPARE millpond_stmt;
