-- Generated from the golang-migrate files of this dialect; keep in step
-- (go test ./internal/sqlcore -run TestGooseMigrations -update-goose).

-- +goose Up
CREATE TABLE IF NOT EXISTS millpond_outbox (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    stream         TEXT NOT NULL,
    consumer_group TEXT NOT NULL DEFAULT '',
    event_key      TEXT NOT NULL,
    event_kind     TEXT NOT NULL,
    payload        BLOB NOT NULL,
    metadata       TEXT NOT NULL DEFAULT '{}',
    content_hash   BLOB NOT NULL,
    status         TEXT NOT NULL CHECK (status IN ('pending', 'processing', 'delivered', 'dead_letter')),
    attempts       INTEGER NOT NULL DEFAULT 0,
    claimed_by     TEXT NOT NULL DEFAULT '',
    claim_key      TEXT NOT NULL DEFAULT '',
    available_at   INTEGER NOT NULL,
    created_at     INTEGER NOT NULL,
    delivered_at   INTEGER,
    last_error     TEXT NOT NULL DEFAULT '',
    UNIQUE (stream, event_key, consumer_group)
);
CREATE INDEX IF NOT EXISTS millpond_outbox_due_idx ON millpond_outbox (stream, consumer_group, id)
    WHERE status IN ('pending', 'processing');
CREATE INDEX IF NOT EXISTS millpond_outbox_dead_idx ON millpond_outbox (stream, consumer_group, id)
    WHERE status = 'dead_letter';
CREATE INDEX IF NOT EXISTS millpond_outbox_delivered_idx ON millpond_outbox (delivered_at)
    WHERE status = 'delivered';
CREATE TABLE IF NOT EXISTS millpond_subscriptions (
    stream         TEXT NOT NULL,
    consumer_group TEXT NOT NULL,
    event_kind     TEXT NOT NULL DEFAULT '',
    created_at     INTEGER NOT NULL,
    PRIMARY KEY (stream, consumer_group, event_kind)
);

-- +goose Down
DROP TABLE IF EXISTS millpond_outbox;
DROP TABLE IF EXISTS millpond_subscriptions;
