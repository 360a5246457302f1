-- Per-key ordering (events of one ordering key delivered one at a time, in
-- commit order, per consumer group). A row waiting behind an earlier event
-- of its key has status 'blocked', outside the claim's status range. MySQL
-- has no ADD COLUMN IF NOT EXISTS, so each step checks the catalogue first
-- and stays safe to run again.
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
