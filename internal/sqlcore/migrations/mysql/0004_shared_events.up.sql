-- Each event's content is stored once (millpond_events), whatever the
-- number of consumer groups; each group's delivery state is a slim row of
-- millpond_deliveries that points at it (same ids as millpond_outbox's
-- rows, delivered_at 0 until delivery). millpond_outbox becomes a read-only
-- view with the 0003 columns.
--
-- MariaDB and MySQL commit each DDL statement on its own, so the old
-- table is first renamed to millpond_outbox_0004 (RENAME waits for the
-- transactions that use it): a replica of the previous version that writes
-- millpond_outbox afterwards fails instead of committing a row after the
-- copy, which the drop would lose. Every step is safe to run again after an
-- interruption: while millpond_outbox_0004 exists, the new tables are only
-- a copy of it, emptied and filled again (one INSERT ... SELECT each); once
-- it is dropped, only the view is left to create. Run it with the
-- application stopped.
CREATE TABLE IF NOT EXISTS millpond_events (
    id           BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    created_at   BIGINT NOT NULL,
    stream       VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    event_key    VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    event_kind   VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    content_hash BINARY(32) NOT NULL,
    metadata     MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    payload      LONGBLOB NOT NULL,
    UNIQUE KEY millpond_events_key_unique (stream, event_key)
) ENGINE=InnoDB;
CREATE TABLE IF NOT EXISTS millpond_deliveries (
    id             BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    event_id       BIGINT NOT NULL,
    stream         VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    consumer_group VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '',
    status         VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    attempts       INT NOT NULL DEFAULT 0,
    claimed_by     VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '',
    claim_key      VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '',
    available_at   BIGINT NOT NULL,
    delivered_at   BIGINT NOT NULL DEFAULT 0,
    last_error     VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '',
    ordering_key   VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '',
    ordering_seq   BIGINT NOT NULL DEFAULT 0,
    key_released   TINYINT(1) NOT NULL DEFAULT 0,
    UNIQUE KEY millpond_deliveries_event_unique (event_id, consumer_group),
    KEY millpond_deliveries_due_idx (stream, consumer_group, status, id),
    KEY millpond_deliveries_delivered_idx (status, delivered_at),
    KEY millpond_deliveries_blocked_idx (stream, consumer_group, ordering_key, status, ordering_seq)
) ENGINE=InnoDB;
SET @millpond_step = IF((SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_outbox' AND TABLE_TYPE = 'BASE TABLE') > 0
    AND (SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_outbox_0004') = 0,
    'RENAME TABLE millpond_outbox TO millpond_outbox_0004',
    'DO 0');
PREPARE millpond_stmt FROM @millpond_step;
EXECUTE millpond_stmt;
DEALLOCATE PREPARE millpond_stmt;
SET @millpond_step = IF((SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_outbox_0004'),
    'TRUNCATE TABLE millpond_deliveries',
    'DO 0');
PREPARE millpond_stmt FROM @millpond_step;
EXECUTE millpond_stmt;
DEALLOCATE PREPARE millpond_stmt;
SET @millpond_step = IF((SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_outbox_0004'),
    'TRUNCATE TABLE millpond_events',
    'DO 0');
PREPARE millpond_stmt FROM @millpond_step;
EXECUTE millpond_stmt;
DEALLOCATE PREPARE millpond_stmt;
SET @millpond_step = IF((SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_outbox_0004'),
    'INSERT INTO millpond_events (id, created_at, stream, event_key, event_kind, content_hash, metadata, payload)
SELECT o.id, o.created_at, o.stream, o.event_key, o.event_kind, o.content_hash, o.metadata, o.payload
FROM millpond_outbox_0004 o JOIN (SELECT MIN(id) AS id FROM millpond_outbox_0004 GROUP BY stream, event_key) f ON f.id = o.id
ORDER BY o.id',
    'DO 0');
PREPARE millpond_stmt FROM @millpond_step;
EXECUTE millpond_stmt;
DEALLOCATE PREPARE millpond_stmt;
SET @millpond_step = IF((SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_outbox_0004'),
    'INSERT INTO millpond_deliveries (id, event_id, stream, consumer_group, status, attempts, claimed_by, claim_key,
    available_at, delivered_at, last_error, ordering_key, ordering_seq, key_released)
SELECT o.id, e.id, o.stream, o.consumer_group, o.status, o.attempts, o.claimed_by, o.claim_key,
    o.available_at, COALESCE(o.delivered_at, 0), o.last_error, o.ordering_key, o.ordering_seq, o.key_released
FROM millpond_outbox_0004 o JOIN millpond_events e ON e.stream = o.stream AND e.event_key = o.event_key
ORDER BY o.id',
    'DO 0');
PREPARE millpond_stmt FROM @millpond_step;
EXECUTE millpond_stmt;
DEALLOCATE PREPARE millpond_stmt;
SET @millpond_step = (SELECT IF(COUNT(*) > 0 AND MAX(AUTO_INCREMENT) IS NOT NULL,
    CONCAT('ALTER TABLE millpond_deliveries AUTO_INCREMENT = ', MAX(AUTO_INCREMENT)),
    'DO 0')
    FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_outbox_0004');
PREPARE millpond_stmt FROM @millpond_step;
EXECUTE millpond_stmt;
DEALLOCATE PREPARE millpond_stmt;
SET @millpond_step = (SELECT IF(COUNT(*) > 0 AND MAX(AUTO_INCREMENT) IS NOT NULL,
    CONCAT('ALTER TABLE millpond_events AUTO_INCREMENT = ', MAX(AUTO_INCREMENT)),
    'DO 0')
    FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_outbox_0004');
PREPARE millpond_stmt FROM @millpond_step;
EXECUTE millpond_stmt;
DEALLOCATE PREPARE millpond_stmt;
SET @millpond_step = IF((SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_outbox_0004'),
    'DROP TABLE millpond_outbox_0004',
    'DO 0');
PREPARE millpond_stmt FROM @millpond_step;
EXECUTE millpond_stmt;
DEALLOCATE PREPARE millpond_stmt;
-- MariaDB and MySQL let an UPDATE change a join view's columns of one
-- table: a replica of the previous version still running would claim,
-- fail and extend rows through the view (its acknowledgement, which sets
-- delivered_at, fails), so the handler ran and the event was delivered
-- again after the lease. Every column such a replica writes is an
-- expression (COALESCE of one argument: same type and value), which no
-- statement can write; the columns indexes are searched by stay plain.
CREATE OR REPLACE VIEW millpond_outbox AS
SELECT d.id, d.stream, d.consumer_group, e.event_key, COALESCE(e.event_kind) AS event_kind, COALESCE(e.payload) AS payload,
    COALESCE(e.metadata) AS metadata, COALESCE(e.content_hash) AS content_hash,
    COALESCE(d.status) AS status, COALESCE(d.attempts) AS attempts, COALESCE(d.claimed_by) AS claimed_by,
    COALESCE(d.claim_key) AS claim_key, COALESCE(d.available_at) AS available_at, COALESCE(e.created_at) AS created_at,
    NULLIF(d.delivered_at, 0) AS delivered_at, COALESCE(d.last_error) AS last_error, d.ordering_key,
    COALESCE(d.ordering_seq) AS ordering_seq, COALESCE(d.key_released) AS key_released
FROM millpond_deliveries d LEFT JOIN millpond_events e ON e.id = d.event_id;
