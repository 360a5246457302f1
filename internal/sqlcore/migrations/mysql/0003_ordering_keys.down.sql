-- Blocked events become plain pending events: they are delivered, without
-- their order. Each step checks the catalogue first, so it is safe to run
-- on a schema that is already gone.
SET @millpond_step = (SELECT IF(COUNT(*) > 0,
    'UPDATE millpond_outbox SET status = ''pending'' WHERE status = ''blocked''',
    'DO 0')
    FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_outbox');
PREPARE millpond_stmt FROM @millpond_step;
EXECUTE millpond_stmt;
DEALLOCATE PREPARE millpond_stmt;
SET @millpond_step = (SELECT IF(COUNT(*) > 0,
    'ALTER TABLE millpond_outbox DROP KEY millpond_outbox_blocked_idx',
    'DO 0')
    FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_outbox' AND INDEX_NAME = 'millpond_outbox_blocked_idx');
PREPARE millpond_stmt FROM @millpond_step;
EXECUTE millpond_stmt;
DEALLOCATE PREPARE millpond_stmt;
SET @millpond_step = (SELECT IF(COUNT(*) > 0,
    'ALTER TABLE millpond_outbox DROP COLUMN ordering_key, DROP COLUMN ordering_seq, DROP COLUMN key_released',
    'DO 0')
    FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_outbox' AND COLUMN_NAME = 'ordering_key');
PREPARE millpond_stmt FROM @millpond_step;
EXECUTE millpond_stmt;
DEALLOCATE PREPARE millpond_stmt;
DROP TABLE IF EXISTS millpond_ordering;
