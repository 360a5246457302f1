-- Back to the version-5 due index, in one ALTER TABLE run only while phase
-- exists (safe to run again).
SET @millpond_step = (SELECT IF(COUNT(*) = 1,
    'ALTER TABLE millpond_deliveries
    DROP INDEX millpond_deliveries_phase_idx,
    DROP COLUMN phase,
    ADD KEY millpond_deliveries_due_idx (stream, consumer_group, status, id)',
    'DO 0')
    FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_deliveries' AND COLUMN_NAME = 'phase');
PREPARE millpond_stmt FROM @millpond_step;
EXECUTE millpond_stmt;
DEALLOCATE PREPARE millpond_stmt;
