-- A claim turns pending rows into processing ones, and every secondary
-- index holding status then has its entry deleted and inserted again: the
-- due index (stream, consumer_group, status, id) once per claimed row, as
-- much work again as the rest of the claim's UPDATE. Pending and
-- processing rows are due alike once available_at has passed, so the due
-- index keeps them in one range instead, by a stored column, phase:
--
--   1  pending or processing (a claim, an expired lease, a failure or a
--      release moves no entry)
--   2  blocked behind an earlier event of its ordering key
--   3  dead_letter
--   4  delivered
--
-- millpond_deliveries_due_idx (stream, consumer_group, status, id) becomes
-- millpond_deliveries_phase_idx (stream, consumer_group, phase, id). A
-- claim reads phase 1 in id order and checks available_at (as it did for
-- processing rows); reads of dead letters, blocked or unsettled rows of a
-- group name their phases.
--
-- A single ALTER TABLE (MariaDB and MySQL apply it whole or not at all),
-- run only while phase is missing, so the step can run again. It rebuilds
-- the table: run it with the application stopped.
SET @millpond_step = (SELECT IF(COUNT(*) = 0,
    'ALTER TABLE millpond_deliveries
    ADD COLUMN phase TINYINT GENERATED ALWAYS AS (CASE WHEN status IN (''pending'', ''processing'') THEN 1 WHEN status = ''blocked'' THEN 2 WHEN status = ''dead_letter'' THEN 3 ELSE 4 END) STORED,
    DROP INDEX millpond_deliveries_due_idx,
    ADD KEY millpond_deliveries_phase_idx (stream, consumer_group, phase, id)',
    'DO 0')
    FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_deliveries' AND COLUMN_NAME = 'phase');
PREPARE millpond_stmt FROM @millpond_step;
EXECUTE millpond_stmt;
DEALLOCATE PREPARE millpond_stmt;
