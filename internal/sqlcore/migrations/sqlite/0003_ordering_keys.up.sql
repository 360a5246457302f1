-- Per-key ordering (events of one ordering key delivered one at a time, in
-- commit order, per consumer group). A row waiting behind an earlier event
-- of its key has status 'blocked', outside the claim index. SQLite cannot
-- change a CHECK constraint, so the table is rebuilt (the procedure of
-- SQLite's ALTER TABLE documentation), keeping every row, id and the
-- AUTOINCREMENT high-water mark. Run again over a rebuilt table it keeps
-- every event but resets the ordering columns (see docs/architecture.md).
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
