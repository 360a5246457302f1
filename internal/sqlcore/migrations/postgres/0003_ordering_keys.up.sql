-- Per-key ordering (events of one ordering key delivered one at a time, in
-- commit order, per consumer group).
--
-- A row waiting behind an earlier event of its key has status 'blocked' and
-- settled true: the claim index (WHERE NOT settled) leaves it out, so claims
-- never walk the backlog of a blocked key, the claim statement is unchanged
-- and no existing index is rebuilt. (A NULL settled would leave it out too,
-- but the planner counts NULLs as matching NOT settled and then prefers the
-- primary key for claims.) The blocked index finds the next event of a key
-- when its head settles; its predicate reads no column a claim writes, so
-- claims stay HOT updates.
ALTER TABLE millpond_outbox ADD COLUMN IF NOT EXISTS ordering_key VARCHAR(128) COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE millpond_outbox ADD COLUMN IF NOT EXISTS ordering_seq BIGINT NOT NULL DEFAULT 0;
ALTER TABLE millpond_outbox ADD COLUMN IF NOT EXISTS key_released BOOLEAN NOT NULL DEFAULT false;
CREATE INDEX IF NOT EXISTS millpond_outbox_blocked_idx ON millpond_outbox (stream, consumer_group, ordering_key, ordering_seq)
    WHERE settled AND delivered_at IS NULL AND ordering_key <> '';
-- One row per (stream, consumer group, ordering key): the key's last
-- sequence number and how many of its events the group has not settled.
-- Producers and settlers of a key serialise on this row.
CREATE TABLE IF NOT EXISTS millpond_ordering (
    stream         VARCHAR(128) COLLATE "C" NOT NULL,
    consumer_group VARCHAR(128) COLLATE "C" NOT NULL,
    ordering_key   VARCHAR(128) COLLATE "C" NOT NULL,
    last_seq       BIGINT NOT NULL,
    unsettled      BIGINT NOT NULL,
    PRIMARY KEY (stream, consumer_group, ordering_key)
);
