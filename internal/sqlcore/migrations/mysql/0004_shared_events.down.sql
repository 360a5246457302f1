-- Back to one millpond_outbox row per event and group, every row and id
-- kept. Safe to run again after an interruption, and on a schema that is
-- already gone: the copy (millpond_outbox_0003, emptied and filled again)
-- is made while millpond_deliveries_0004 exists and millpond_outbox is not a
-- table; the copy then takes the view's place. The new tables are first
-- renamed to millpond_deliveries_0004 and millpond_events_0004 (RENAME
-- waits for the transactions that use them): a replica of the new version
-- still running then fails instead of committing an event after the copy,
-- which the drop would lose.
SET @millpond_step = IF((SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_deliveries') > 0
    AND (SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_outbox' AND TABLE_TYPE = 'BASE TABLE') = 0
    AND (SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_deliveries_0004') = 0,
    'RENAME TABLE millpond_deliveries TO millpond_deliveries_0004, millpond_events TO millpond_events_0004',
    'DO 0');
PREPARE millpond_stmt FROM @millpond_step;
EXECUTE millpond_stmt;
DEALLOCATE PREPARE millpond_stmt;
SET @millpond_step = IF((SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_deliveries_0004') > 0 AND (SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_outbox' AND TABLE_TYPE = 'BASE TABLE') = 0,
    'CREATE TABLE IF NOT EXISTS millpond_outbox_0003 (
    id             BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    stream         VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    consumer_group VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '''',
    event_key      VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    event_kind     VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    payload        LONGBLOB NOT NULL,
    metadata       MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    content_hash   BINARY(32) NOT NULL,
    status         VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    attempts       INT NOT NULL DEFAULT 0,
    claimed_by     VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '''',
    claim_key      VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '''',
    available_at   BIGINT NOT NULL,
    created_at     BIGINT NOT NULL,
    delivered_at   BIGINT NULL,
    last_error     VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '''',
    ordering_key   VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '''',
    ordering_seq   BIGINT NOT NULL DEFAULT 0,
    key_released   TINYINT(1) NOT NULL DEFAULT 0,
    UNIQUE KEY millpond_outbox_event_unique (stream, event_key, consumer_group),
    KEY millpond_outbox_due_idx (stream, consumer_group, status, id),
    KEY millpond_outbox_delivered_idx (status, delivered_at),
    KEY millpond_outbox_blocked_idx (stream, consumer_group, ordering_key, status, ordering_seq)
) ENGINE=InnoDB',
    'DO 0');
PREPARE millpond_stmt FROM @millpond_step;
EXECUTE millpond_stmt;
DEALLOCATE PREPARE millpond_stmt;
SET @millpond_step = IF((SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_deliveries_0004') > 0 AND (SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_outbox' AND TABLE_TYPE = 'BASE TABLE') = 0,
    'TRUNCATE TABLE millpond_outbox_0003',
    'DO 0');
PREPARE millpond_stmt FROM @millpond_step;
EXECUTE millpond_stmt;
DEALLOCATE PREPARE millpond_stmt;
SET @millpond_step = IF((SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_deliveries_0004') > 0 AND (SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_outbox' AND TABLE_TYPE = 'BASE TABLE') = 0,
    'INSERT INTO millpond_outbox_0003 (id, stream, consumer_group, event_key, event_kind, payload, metadata, content_hash, status, attempts,
    claimed_by, claim_key, available_at, created_at, delivered_at, last_error, ordering_key, ordering_seq, key_released)
SELECT d.id, d.stream, d.consumer_group, e.event_key, e.event_kind, e.payload, e.metadata, e.content_hash, d.status, d.attempts,
    d.claimed_by, d.claim_key, d.available_at, e.created_at, NULLIF(d.delivered_at, 0), d.last_error, d.ordering_key, d.ordering_seq, d.key_released
FROM millpond_deliveries_0004 d JOIN millpond_events_0004 e ON e.id = d.event_id
ORDER BY d.id',
    'DO 0');
PREPARE millpond_stmt FROM @millpond_step;
EXECUTE millpond_stmt;
DEALLOCATE PREPARE millpond_stmt;
SET @millpond_step = (SELECT IF((SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_deliveries_0004') > 0 AND (SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_outbox' AND TABLE_TYPE = 'BASE TABLE') = 0 AND COUNT(*) > 0 AND MAX(AUTO_INCREMENT) IS NOT NULL,
    CONCAT('ALTER TABLE millpond_outbox_0003 AUTO_INCREMENT = ', MAX(AUTO_INCREMENT)),
    'DO 0')
    FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_deliveries_0004');
PREPARE millpond_stmt FROM @millpond_step;
EXECUTE millpond_stmt;
DEALLOCATE PREPARE millpond_stmt;
-- An event no delivery row points at (acknowledged by every group under
-- WithDeleteOnAck) is its key's idempotency record: this layout keeps it as
-- a delivered row of the default group, so that enqueueing the key again
-- stays a no-op. (After the copy and the AUTO_INCREMENT: new ids.)
SET @millpond_step = IF((SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_deliveries_0004') > 0 AND (SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_outbox' AND TABLE_TYPE = 'BASE TABLE') = 0,
    'INSERT INTO millpond_outbox_0003 (stream, consumer_group, event_key, event_kind, payload, metadata, content_hash, status, attempts,
    available_at, created_at, delivered_at)
SELECT e.stream, '''', e.event_key, e.event_kind, e.payload, e.metadata, e.content_hash, ''delivered'', 0,
    e.created_at, e.created_at, e.created_at
FROM millpond_events_0004 e
WHERE NOT EXISTS (SELECT 1 FROM millpond_deliveries_0004 d WHERE d.event_id = e.id)
ORDER BY e.id',
    'DO 0');
PREPARE millpond_stmt FROM @millpond_step;
EXECUTE millpond_stmt;
DEALLOCATE PREPARE millpond_stmt;
SET @millpond_step = IF((SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_outbox' AND TABLE_TYPE = 'VIEW') > 0,
    'DROP VIEW millpond_outbox',
    'DO 0');
PREPARE millpond_stmt FROM @millpond_step;
EXECUTE millpond_stmt;
DEALLOCATE PREPARE millpond_stmt;
SET @millpond_step = IF((SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_outbox_0003') > 0 AND (SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_outbox') = 0,
    'RENAME TABLE millpond_outbox_0003 TO millpond_outbox',
    'DO 0');
PREPARE millpond_stmt FROM @millpond_step;
EXECUTE millpond_stmt;
DEALLOCATE PREPARE millpond_stmt;
DROP TABLE IF EXISTS millpond_deliveries;
DROP TABLE IF EXISTS millpond_events;
DROP TABLE IF EXISTS millpond_deliveries_0004;
DROP TABLE IF EXISTS millpond_events_0004;
