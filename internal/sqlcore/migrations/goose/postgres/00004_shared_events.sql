-- Generated from the golang-migrate files of this dialect; keep in step
-- (go test ./internal/sqlcore -run TestGooseMigrations -update-goose).

-- +goose Up
CREATE TABLE IF NOT EXISTS millpond_events (
    id           BIGSERIAL PRIMARY KEY,
    created_at   BIGINT NOT NULL,
    stream       VARCHAR(128) COLLATE "C" NOT NULL,
    event_key    VARCHAR(128) COLLATE "C" NOT NULL,
    event_kind   VARCHAR(128) COLLATE "C" NOT NULL,
    content_hash BYTEA NOT NULL,
    metadata     TEXT NOT NULL DEFAULT '{}',
    payload      BYTEA NOT NULL,
    CONSTRAINT millpond_events_key_unique UNIQUE (stream, event_key)
);
CREATE TABLE IF NOT EXISTS millpond_deliveries (
    id             BIGSERIAL PRIMARY KEY,
    event_id       BIGINT NOT NULL,
    available_at   BIGINT NOT NULL,
    delivered_at   BIGINT NOT NULL DEFAULT 0,
    ordering_seq   BIGINT NOT NULL DEFAULT 0,
    attempts       INTEGER NOT NULL DEFAULT 0,
    settled        BOOLEAN NOT NULL DEFAULT false,
    key_released   BOOLEAN NOT NULL DEFAULT false,
    stream         VARCHAR(128) COLLATE "C" NOT NULL,
    consumer_group VARCHAR(128) COLLATE "C" NOT NULL DEFAULT '',
    status         VARCHAR(16) NOT NULL,
    ordering_key   VARCHAR(128) COLLATE "C" NOT NULL DEFAULT '',
    claim_key      VARCHAR(32) NOT NULL DEFAULT '',
    claimed_by     VARCHAR(128) NOT NULL DEFAULT '',
    last_error     VARCHAR(512) NOT NULL DEFAULT '',
    CONSTRAINT millpond_deliveries_event_unique UNIQUE (event_id, consumer_group)
) WITH (fillfactor = 40);
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_class WHERE oid = to_regclass('millpond_outbox') AND relkind = 'r') THEN
        -- Locked before the copy, until the step commits: a replica of the
        -- previous version that writes the table meanwhile waits, and its
        -- statement then fails on the view. Without the lock, a row it
        -- committed after the copy's snapshot was dropped with the table.
        LOCK TABLE millpond_outbox IN ACCESS EXCLUSIVE MODE;
        -- An event's rows share its content; the event takes the id of its
        -- first row.
        INSERT INTO millpond_events (id, created_at, stream, event_key, event_kind, content_hash, metadata, payload)
        SELECT DISTINCT ON (stream, event_key) id, created_at, stream, event_key, event_kind, content_hash, metadata, payload
        FROM millpond_outbox
        ORDER BY stream, event_key, id;
        INSERT INTO millpond_deliveries (id, event_id, available_at, delivered_at, ordering_seq, attempts, settled, key_released,
            stream, consumer_group, status, ordering_key, claim_key, claimed_by, last_error)
        SELECT o.id, e.id, o.available_at, COALESCE(o.delivered_at, 0), o.ordering_seq, o.attempts, o.settled, o.key_released,
            o.stream, o.consumer_group, o.status, o.ordering_key, o.claim_key, o.claimed_by, o.last_error
        FROM millpond_outbox o JOIN millpond_events e ON e.stream = o.stream AND e.event_key = o.event_key
        ORDER BY o.id;
        -- New ids continue after every id the old table handed out.
        PERFORM setval('millpond_events_id_seq', GREATEST(s.last_value, 1), s.is_called),
                setval('millpond_deliveries_id_seq', GREATEST(s.last_value, 1), s.is_called)
        FROM millpond_outbox_id_seq s;
        DROP TABLE millpond_outbox;
    END IF;
END
$$;
-- +goose StatementEnd
CREATE INDEX IF NOT EXISTS millpond_deliveries_due_idx ON millpond_deliveries (stream, consumer_group, (id + 0))
    WHERE NOT settled;
CREATE INDEX IF NOT EXISTS millpond_deliveries_dead_idx ON millpond_deliveries (stream, consumer_group, id)
    WHERE settled AND delivered_at = 0;
CREATE INDEX IF NOT EXISTS millpond_deliveries_delivered_idx ON millpond_deliveries (delivered_at)
    WHERE delivered_at <> 0;
CREATE INDEX IF NOT EXISTS millpond_deliveries_blocked_idx ON millpond_deliveries (stream, consumer_group, ordering_key, ordering_seq)
    WHERE settled AND delivered_at = 0 AND ordering_key <> '';
DROP TRIGGER IF EXISTS millpond_outbox_notify ON millpond_deliveries;
CREATE TRIGGER millpond_outbox_notify AFTER UPDATE OF status ON millpond_deliveries
    FOR EACH ROW WHEN (NEW.status = 'pending') EXECUTE FUNCTION millpond_outbox_notify();
CREATE OR REPLACE VIEW millpond_outbox AS
SELECT d.id, d.stream, d.consumer_group, e.event_key, e.event_kind, e.payload, e.metadata, e.content_hash,
    d.status, d.attempts, d.claimed_by, d.claim_key, d.available_at, e.created_at, NULLIF(d.delivered_at, 0) AS delivered_at,
    d.last_error, d.settled, d.ordering_key, d.ordering_seq, d.key_released
FROM millpond_deliveries d LEFT JOIN millpond_events e ON e.id = d.event_id;

-- +goose Down
-- +goose StatementBegin
DO $$
BEGIN
    IF to_regclass('millpond_deliveries') IS NOT NULL THEN
        -- Locked before the copy, until the step commits: a writer of the
        -- new layout still running waits, then fails; without the lock a
        -- row it committed after the copy was dropped with the tables.
        LOCK TABLE millpond_events, millpond_deliveries IN ACCESS EXCLUSIVE MODE;
        DROP VIEW IF EXISTS millpond_outbox;
        CREATE TABLE millpond_outbox (
            id             BIGSERIAL PRIMARY KEY,
            stream         VARCHAR(128) COLLATE "C" NOT NULL,
            consumer_group VARCHAR(128) COLLATE "C" NOT NULL DEFAULT '',
            event_key      VARCHAR(128) COLLATE "C" NOT NULL,
            event_kind     VARCHAR(128) COLLATE "C" NOT NULL,
            payload        BYTEA NOT NULL,
            metadata       TEXT NOT NULL DEFAULT '{}',
            content_hash   BYTEA NOT NULL,
            status         VARCHAR(16) NOT NULL,
            attempts       INTEGER NOT NULL DEFAULT 0,
            claimed_by     VARCHAR(128) NOT NULL DEFAULT '',
            claim_key      VARCHAR(32) NOT NULL DEFAULT '',
            available_at   BIGINT NOT NULL,
            created_at     BIGINT NOT NULL,
            delivered_at   BIGINT,
            last_error     VARCHAR(512) NOT NULL DEFAULT '',
            settled        BOOLEAN NOT NULL DEFAULT false,
            ordering_key   VARCHAR(128) COLLATE "C" NOT NULL DEFAULT '',
            ordering_seq   BIGINT NOT NULL DEFAULT 0,
            key_released   BOOLEAN NOT NULL DEFAULT false,
            CONSTRAINT millpond_outbox_event_unique UNIQUE (stream, event_key, consumer_group)
        ) WITH (fillfactor = 50);
        INSERT INTO millpond_outbox (id, stream, consumer_group, event_key, event_kind, payload, metadata, content_hash, status, attempts,
            claimed_by, claim_key, available_at, created_at, delivered_at, last_error, settled, ordering_key, ordering_seq, key_released)
        SELECT d.id, d.stream, d.consumer_group, e.event_key, e.event_kind, e.payload, e.metadata, e.content_hash, d.status, d.attempts,
            d.claimed_by, d.claim_key, d.available_at, e.created_at, NULLIF(d.delivered_at, 0), d.last_error, d.settled, d.ordering_key, d.ordering_seq, d.key_released
        FROM millpond_deliveries d JOIN millpond_events e ON e.id = d.event_id
        ORDER BY d.id;
        PERFORM setval('millpond_outbox_id_seq', GREATEST(s.last_value, 1), s.is_called) FROM millpond_deliveries_id_seq s;
        -- An event no delivery row points at (acknowledged by every group
        -- under WithDeleteOnAck) is its key's idempotency record: this
        -- layout keeps it as a delivered row of the default group, so that
        -- enqueueing the key again stays a no-op.
        INSERT INTO millpond_outbox (stream, consumer_group, event_key, event_kind, payload, metadata, content_hash, status, attempts,
            available_at, created_at, delivered_at, settled)
        SELECT e.stream, '', e.event_key, e.event_kind, e.payload, e.metadata, e.content_hash, 'delivered', 0,
            e.created_at, e.created_at, e.created_at, true
        FROM millpond_events e
        WHERE NOT EXISTS (SELECT 1 FROM millpond_deliveries d WHERE d.event_id = e.id)
        ORDER BY e.id;
        CREATE INDEX millpond_outbox_due_idx ON millpond_outbox (stream, consumer_group, id)
            WHERE NOT settled;
        CREATE INDEX millpond_outbox_dead_idx ON millpond_outbox (stream, consumer_group, id)
            WHERE settled AND delivered_at IS NULL;
        CREATE INDEX millpond_outbox_delivered_idx ON millpond_outbox (delivered_at)
            WHERE delivered_at IS NOT NULL;
        CREATE INDEX millpond_outbox_blocked_idx ON millpond_outbox (stream, consumer_group, ordering_key, ordering_seq)
            WHERE settled AND delivered_at IS NULL AND ordering_key <> '';
        CREATE TRIGGER millpond_outbox_notify AFTER UPDATE OF status ON millpond_outbox
            FOR EACH ROW WHEN (NEW.status = 'pending') EXECUTE FUNCTION millpond_outbox_notify();
        DROP TABLE millpond_deliveries;
        DROP TABLE millpond_events;
    END IF;
END
$$;
-- +goose StatementEnd
