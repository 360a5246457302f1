-- Generated from the golang-migrate files of this dialect; keep in step
-- (go test ./internal/sqlcore -run TestGooseMigrations -update-goose).

-- +goose Up
CREATE TABLE millpond_outbox_rebuild (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    stream         TEXT NOT NULL,
    consumer_group TEXT NOT NULL DEFAULT '',
    event_key      TEXT NOT NULL,
    event_kind     TEXT NOT NULL,
    payload        BLOB NOT NULL,
    metadata       TEXT NOT NULL DEFAULT '{}',
    content_hash   BLOB NOT NULL,
    status         TEXT NOT NULL CHECK (status IN ('pending', 'processing', 'delivered', 'dead_letter', 'blocked')),
    attempts       INTEGER NOT NULL DEFAULT 0,
    claimed_by     TEXT NOT NULL DEFAULT '',
    claim_key      TEXT NOT NULL DEFAULT '',
    available_at   INTEGER NOT NULL,
    created_at     INTEGER NOT NULL,
    delivered_at   INTEGER,
    last_error     TEXT NOT NULL DEFAULT '',
    ordering_key   TEXT NOT NULL DEFAULT '',
    ordering_seq   INTEGER NOT NULL DEFAULT 0,
    key_released   INTEGER NOT NULL DEFAULT 0,
    UNIQUE (stream, event_key, consumer_group)
);
INSERT INTO millpond_outbox_rebuild (id, stream, consumer_group, event_key, event_kind, payload, metadata, content_hash, status, attempts, claimed_by, claim_key, available_at, created_at, delivered_at, last_error)
SELECT id, stream, consumer_group, event_key, event_kind, payload, metadata, content_hash, status, attempts, claimed_by, claim_key, available_at, created_at, delivered_at, last_error
FROM millpond_outbox;
DELETE FROM sqlite_sequence WHERE name = 'millpond_outbox_rebuild';
INSERT INTO sqlite_sequence (name, seq) SELECT 'millpond_outbox_rebuild', seq FROM sqlite_sequence WHERE name = 'millpond_outbox';
DROP TABLE millpond_outbox;
ALTER TABLE millpond_outbox_rebuild RENAME TO millpond_outbox;
CREATE INDEX IF NOT EXISTS millpond_outbox_due_idx ON millpond_outbox (stream, consumer_group, id)
    WHERE status IN ('pending', 'processing');
CREATE INDEX IF NOT EXISTS millpond_outbox_dead_idx ON millpond_outbox (stream, consumer_group, id)
    WHERE status = 'dead_letter';
CREATE INDEX IF NOT EXISTS millpond_outbox_delivered_idx ON millpond_outbox (delivered_at)
    WHERE status = 'delivered';
CREATE INDEX IF NOT EXISTS millpond_outbox_blocked_idx ON millpond_outbox (stream, consumer_group, ordering_key, ordering_seq)
    WHERE status = 'blocked';
CREATE TABLE IF NOT EXISTS millpond_ordering (
    stream         TEXT NOT NULL,
    consumer_group TEXT NOT NULL,
    ordering_key   TEXT NOT NULL,
    last_seq       INTEGER NOT NULL,
    unsettled      INTEGER NOT NULL,
    PRIMARY KEY (stream, consumer_group, ordering_key)
);

-- +goose Down
CREATE TABLE IF NOT EXISTS millpond_outbox (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    stream         TEXT NOT NULL,
    consumer_group TEXT NOT NULL DEFAULT '',
    event_key      TEXT NOT NULL,
    event_kind     TEXT NOT NULL,
    payload        BLOB NOT NULL,
    metadata       TEXT NOT NULL DEFAULT '{}',
    content_hash   BLOB NOT NULL,
    status         TEXT NOT NULL,
    attempts       INTEGER NOT NULL DEFAULT 0,
    claimed_by     TEXT NOT NULL DEFAULT '',
    claim_key      TEXT NOT NULL DEFAULT '',
    available_at   INTEGER NOT NULL,
    created_at     INTEGER NOT NULL,
    delivered_at   INTEGER,
    last_error     TEXT NOT NULL DEFAULT '',
    UNIQUE (stream, event_key, consumer_group)
);
CREATE TABLE millpond_outbox_rebuild (
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
INSERT INTO millpond_outbox_rebuild (id, stream, consumer_group, event_key, event_kind, payload, metadata, content_hash, status, attempts, claimed_by, claim_key, available_at, created_at, delivered_at, last_error)
SELECT id, stream, consumer_group, event_key, event_kind, payload, metadata, content_hash, CASE WHEN status = 'blocked' THEN 'pending' ELSE status END, attempts, claimed_by, claim_key, available_at, created_at, delivered_at, last_error
FROM millpond_outbox;
DELETE FROM sqlite_sequence WHERE name = 'millpond_outbox_rebuild';
INSERT INTO sqlite_sequence (name, seq) SELECT 'millpond_outbox_rebuild', seq FROM sqlite_sequence WHERE name = 'millpond_outbox';
DROP TABLE millpond_outbox;
ALTER TABLE millpond_outbox_rebuild RENAME TO millpond_outbox;
CREATE INDEX IF NOT EXISTS millpond_outbox_due_idx ON millpond_outbox (stream, consumer_group, id)
    WHERE status IN ('pending', 'processing');
CREATE INDEX IF NOT EXISTS millpond_outbox_dead_idx ON millpond_outbox (stream, consumer_group, id)
    WHERE status = 'dead_letter';
CREATE INDEX IF NOT EXISTS millpond_outbox_delivered_idx ON millpond_outbox (delivered_at)
    WHERE status = 'delivered';
DROP TABLE IF EXISTS millpond_ordering;
