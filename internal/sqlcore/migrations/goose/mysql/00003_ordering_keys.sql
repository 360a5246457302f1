-- Generated from the golang-migrate files of this dialect; keep in step
-- (go test ./internal/sqlcore -run TestGooseMigrations -update-goose).

-- +goose Up
SET @millpond_step = (SELECT IF(COUNT(*) = 0,
    'ALTER TABLE millpond_outbox ADD COLUMN ordering_key VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '''', ADD COLUMN ordering_seq BIGINT NOT NULL DEFAULT 0, ADD COLUMN key_released TINYINT(1) NOT NULL DEFAULT 0',
    'DO 0')
    FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_outbox' AND COLUMN_NAME = 'ordering_key');
PREPARE millpond_stmt FROM @millpond_step;
EXECUTE millpond_stmt;
DEALLOCATE PREPARE millpond_stmt;
SET @millpond_step = (SELECT IF(COUNT(*) = 0,
    'ALTER TABLE millpond_outbox ADD KEY millpond_outbox_blocked_idx (stream, consumer_group, ordering_key, status, ordering_seq)',
    'DO 0')
    FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_outbox' AND INDEX_NAME = 'millpond_outbox_blocked_idx');
PREPARE millpond_stmt FROM @millpond_step;
EXECUTE millpond_stmt;
DEALLOCATE PREPARE millpond_stmt;
CREATE TABLE IF NOT EXISTS millpond_ordering (
    stream         VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    consumer_group VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    ordering_key   VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    last_seq       BIGINT NOT NULL,
    unsettled      BIGINT NOT NULL,
    PRIMARY KEY (stream, consumer_group, ordering_key)
) ENGINE=InnoDB;

-- +goose Down
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
