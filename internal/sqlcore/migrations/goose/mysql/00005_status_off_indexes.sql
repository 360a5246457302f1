-- Generated from the golang-migrate files of this dialect; keep in step
-- (go test ./internal/sqlcore -run TestGooseMigrations -update-goose).

-- +goose Up
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

-- +goose Down
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
