-- Generated from the golang-migrate files of this dialect; keep in step
-- (go test ./internal/sqlcore -run TestGooseMigrations -update-goose).

-- +goose Up
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

-- +goose Down
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
