-- Generated from the golang-migrate files of this dialect; keep in step
-- (go test ./internal/sqlcore -run TestGooseMigrations -update-goose).

-- +goose Up
ALTER TABLE millpond_outbox ADD COLUMN IF NOT EXISTS ordering_key VARCHAR(128) COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE millpond_outbox ADD COLUMN IF NOT EXISTS ordering_seq BIGINT NOT NULL DEFAULT 0;
ALTER TABLE millpond_outbox ADD COLUMN IF NOT EXISTS key_released BOOLEAN NOT NULL DEFAULT false;
CREATE INDEX IF NOT EXISTS millpond_outbox_blocked_idx ON millpond_outbox (stream, consumer_group, ordering_key, ordering_seq)
    WHERE settled AND delivered_at IS NULL AND ordering_key <> '';
CREATE TABLE IF NOT EXISTS millpond_ordering (
    stream         VARCHAR(128) COLLATE "C" NOT NULL,
    consumer_group VARCHAR(128) COLLATE "C" NOT NULL,
    ordering_key   VARCHAR(128) COLLATE "C" NOT NULL,
    last_seq       BIGINT NOT NULL,
    unsettled      BIGINT NOT NULL,
    PRIMARY KEY (stream, consumer_group, ordering_key)
);

-- +goose Down
-- +goose StatementBegin
DO $$
BEGIN
    IF to_regclass('millpond_outbox') IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM information_schema.columns
                   WHERE table_schema = current_schema() AND table_name = 'millpond_outbox' AND column_name = 'ordering_key') THEN
            UPDATE millpond_outbox SET status = 'pending', settled = false WHERE status = 'blocked';
        END IF;
    END IF;
END
$$;
-- +goose StatementEnd
DROP INDEX IF EXISTS millpond_outbox_blocked_idx;
ALTER TABLE IF EXISTS millpond_outbox DROP COLUMN IF EXISTS key_released;
ALTER TABLE IF EXISTS millpond_outbox DROP COLUMN IF EXISTS ordering_seq;
ALTER TABLE IF EXISTS millpond_outbox DROP COLUMN IF EXISTS ordering_key;
DROP TABLE IF EXISTS millpond_ordering;
