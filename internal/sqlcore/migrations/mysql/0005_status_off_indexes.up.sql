-- Claims and acknowledgements change a delivery row's status; every
-- secondary index holding status then has its entry deleted and inserted
-- again (and purged later). Two of the three indexes lose status:
--
--   * millpond_deliveries_blocked_idx (stream, consumer_group, ordering_key,
--     status, ordering_seq) becomes millpond_deliveries_next_idx on a
--     stored column, blocked_seq: the ordering_seq of a blocked row, NULL
--     otherwise. Rows without an ordering key are never blocked, so their
--     entry never changes; a key's next event is its lowest blocked_seq.
--   * millpond_deliveries_delivered_idx (status, delivered_at) becomes
--     millpond_deliveries_settled_idx (delivered_at): delivered_at is 0
--     until the acknowledgement sets it, so the entry changes once, and it
--     still separates undelivered rows (0, read by Stats) from delivered
--     ones (read by Purge, oldest first).
--
-- A single ALTER TABLE (MariaDB and MySQL apply it whole or not at all),
-- run only while blocked_seq is missing, so the step can run again. It
-- rebuilds the table: run it with the application stopped.
SET @millpond_step = (SELECT IF(COUNT(*) = 0,
    'ALTER TABLE millpond_deliveries
    ADD COLUMN blocked_seq BIGINT GENERATED ALWAYS AS (CASE WHEN status = ''blocked'' THEN ordering_seq END) STORED,
    DROP INDEX millpond_deliveries_blocked_idx,
    DROP INDEX millpond_deliveries_delivered_idx,
    ADD KEY millpond_deliveries_next_idx (stream, consumer_group, ordering_key, blocked_seq),
    ADD KEY millpond_deliveries_settled_idx (delivered_at)',
    'DO 0')
    FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_deliveries' AND COLUMN_NAME = 'blocked_seq');
PREPARE millpond_stmt FROM @millpond_step;
EXECUTE millpond_stmt;
DEALLOCATE PREPARE millpond_stmt;
