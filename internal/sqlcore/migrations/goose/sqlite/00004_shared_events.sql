-- Generated from the golang-migrate files of this dialect; keep in step
-- (go test ./internal/sqlcore -run TestGooseMigrations -update-goose).

-- +goose Up
CREATE TABLE IF NOT EXISTS millpond_events (
    id           INTEGER PRIMARY KEY,
    created_at   INTEGER NOT NULL,
    stream       TEXT NOT NULL,
    event_key    TEXT NOT NULL,
    event_kind   TEXT NOT NULL,
    content_hash BLOB NOT NULL,
    metadata     TEXT NOT NULL DEFAULT '{}',
    payload      BLOB NOT NULL,
    UNIQUE (stream, event_key)
);
CREATE TABLE IF NOT EXISTS millpond_deliveries (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id       INTEGER NOT NULL,
    stream         TEXT NOT NULL,
    consumer_group TEXT NOT NULL DEFAULT '',
    status         TEXT NOT NULL CHECK (status IN ('pending', 'processing', 'delivered', 'dead_letter', 'blocked')),
    attempts       INTEGER NOT NULL DEFAULT 0,
    claimed_by     TEXT NOT NULL DEFAULT '',
    claim_key      TEXT NOT NULL DEFAULT '',
    available_at   INTEGER NOT NULL,
    delivered_at   INTEGER NOT NULL DEFAULT 0,
    last_error     TEXT NOT NULL DEFAULT '',
    ordering_key   TEXT NOT NULL DEFAULT '',
    ordering_seq   INTEGER NOT NULL DEFAULT 0,
    key_released   INTEGER NOT NULL DEFAULT 0,
    UNIQUE (event_id, consumer_group)
);
INSERT INTO millpond_events (id, created_at, stream, event_key, event_kind, content_hash, metadata, payload)
SELECT id, created_at, stream, event_key, event_kind, content_hash, metadata, payload
FROM millpond_outbox WHERE id IN (SELECT MIN(id) FROM millpond_outbox GROUP BY stream, event_key)
ORDER BY id;
INSERT INTO millpond_deliveries (id, event_id, stream, consumer_group, status, attempts, claimed_by, claim_key,
    available_at, delivered_at, last_error, ordering_key, ordering_seq, key_released)
SELECT o.id, e.id, o.stream, o.consumer_group, o.status, o.attempts, o.claimed_by, o.claim_key,
    o.available_at, COALESCE(o.delivered_at, 0), o.last_error, o.ordering_key, o.ordering_seq, o.key_released
FROM millpond_outbox o JOIN millpond_events e ON e.stream = o.stream AND e.event_key = o.event_key
ORDER BY o.id;
DELETE FROM sqlite_sequence WHERE name = 'millpond_deliveries';
INSERT INTO sqlite_sequence (name, seq) SELECT 'millpond_deliveries', seq FROM sqlite_sequence WHERE name = 'millpond_outbox';
DROP TABLE millpond_outbox;
CREATE INDEX IF NOT EXISTS millpond_deliveries_due_idx ON millpond_deliveries (stream, consumer_group, id)
    WHERE status IN ('pending', 'processing');
CREATE INDEX IF NOT EXISTS millpond_deliveries_dead_idx ON millpond_deliveries (stream, consumer_group, id)
    WHERE status = 'dead_letter';
CREATE INDEX IF NOT EXISTS millpond_deliveries_delivered_idx ON millpond_deliveries (delivered_at)
    WHERE status = 'delivered';
CREATE INDEX IF NOT EXISTS millpond_deliveries_blocked_idx ON millpond_deliveries (stream, consumer_group, ordering_key, ordering_seq)
    WHERE status = 'blocked';
CREATE VIEW IF NOT EXISTS millpond_outbox AS
SELECT d.id, d.stream, d.consumer_group, e.event_key, e.event_kind, e.payload, e.metadata, e.content_hash,
    d.status, d.attempts, d.claimed_by, d.claim_key, d.available_at, e.created_at, NULLIF(d.delivered_at, 0) AS delivered_at,
    d.last_error, d.ordering_key, d.ordering_seq, d.key_released
FROM millpond_deliveries d LEFT JOIN millpond_events e ON e.id = d.event_id;

-- +goose Down
DROP VIEW IF EXISTS millpond_outbox;
CREATE TABLE IF NOT EXISTS millpond_events (
    id           INTEGER PRIMARY KEY,
    created_at   INTEGER NOT NULL,
    stream       TEXT NOT NULL,
    event_key    TEXT NOT NULL,
    event_kind   TEXT NOT NULL,
    content_hash BLOB NOT NULL,
    metadata     TEXT NOT NULL DEFAULT '{}',
    payload      BLOB NOT NULL,
    UNIQUE (stream, event_key)
);
CREATE TABLE IF NOT EXISTS millpond_deliveries (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id       INTEGER NOT NULL,
    stream         TEXT NOT NULL,
    consumer_group TEXT NOT NULL DEFAULT '',
    status         TEXT NOT NULL,
    attempts       INTEGER NOT NULL DEFAULT 0,
    claimed_by     TEXT NOT NULL DEFAULT '',
    claim_key      TEXT NOT NULL DEFAULT '',
    available_at   INTEGER NOT NULL,
    delivered_at   INTEGER NOT NULL DEFAULT 0,
    last_error     TEXT NOT NULL DEFAULT '',
    ordering_key   TEXT NOT NULL DEFAULT '',
    ordering_seq   INTEGER NOT NULL DEFAULT 0,
    key_released   INTEGER NOT NULL DEFAULT 0,
    UNIQUE (event_id, consumer_group)
);
CREATE TABLE millpond_outbox (
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
INSERT INTO millpond_outbox (id, stream, consumer_group, event_key, event_kind, payload, metadata, content_hash, status, attempts,
    claimed_by, claim_key, available_at, created_at, delivered_at, last_error, ordering_key, ordering_seq, key_released)
SELECT d.id, d.stream, d.consumer_group, e.event_key, e.event_kind, e.payload, e.metadata, e.content_hash, d.status, d.attempts,
    d.claimed_by, d.claim_key, d.available_at, e.created_at, NULLIF(d.delivered_at, 0), d.last_error, d.ordering_key, d.ordering_seq, d.key_released
FROM millpond_deliveries d JOIN millpond_events e ON e.id = d.event_id
ORDER BY d.id;
DELETE FROM sqlite_sequence WHERE name = 'millpond_outbox';
INSERT INTO sqlite_sequence (name, seq) SELECT 'millpond_outbox', seq FROM sqlite_sequence WHERE name = 'millpond_deliveries';
INSERT INTO millpond_outbox (stream, consumer_group, event_key, event_kind, payload, metadata, content_hash, status, attempts,
    available_at, created_at, delivered_at)
SELECT e.stream, '', e.event_key, e.event_kind, e.payload, e.metadata, e.content_hash, 'delivered', 0,
    e.created_at, e.created_at, e.created_at
FROM millpond_events e
WHERE NOT EXISTS (SELECT 1 FROM millpond_deliveries d WHERE d.event_id = e.id)
ORDER BY e.id;
CREATE INDEX IF NOT EXISTS millpond_outbox_due_idx ON millpond_outbox (stream, consumer_group, id)
    WHERE status IN ('pending', 'processing');
CREATE INDEX IF NOT EXISTS millpond_outbox_dead_idx ON millpond_outbox (stream, consumer_group, id)
    WHERE status = 'dead_letter';
CREATE INDEX IF NOT EXISTS millpond_outbox_delivered_idx ON millpond_outbox (delivered_at)
    WHERE status = 'delivered';
CREATE INDEX IF NOT EXISTS millpond_outbox_blocked_idx ON millpond_outbox (stream, consumer_group, ordering_key, ordering_seq)
    WHERE status = 'blocked';
DROP TABLE millpond_deliveries;
DROP TABLE millpond_events;
