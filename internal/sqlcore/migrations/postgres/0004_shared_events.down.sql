-- Back to one millpond_outbox row per event and group, every row and id
-- kept, and every event without rows kept as a delivered row. Idempotent, like every down step: it does nothing when
-- millpond_deliveries is gone.
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
