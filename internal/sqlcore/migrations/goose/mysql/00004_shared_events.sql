-- Generated from the golang-migrate files of this dialect; keep in step
-- (go test ./internal/sqlcore -run TestGooseMigrations -update-goose).

-- +goose Up
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
CREATE OR REPLACE VIEW millpond_outbox AS
SELECT d.id, d.stream, d.consumer_group, e.event_key, COALESCE(e.event_kind) AS event_kind, COALESCE(e.payload) AS payload,
    COALESCE(e.metadata) AS metadata, COALESCE(e.content_hash) AS content_hash,
    COALESCE(d.status) AS status, COALESCE(d.attempts) AS attempts, COALESCE(d.claimed_by) AS claimed_by,
    COALESCE(d.claim_key) AS claim_key, COALESCE(d.available_at) AS available_at, COALESCE(e.created_at) AS created_at,
    NULLIF(d.delivered_at, 0) AS delivered_at, COALESCE(d.last_error) AS last_error, d.ordering_key,
    COALESCE(d.ordering_seq) AS ordering_seq, COALESCE(d.key_released) AS key_released
FROM millpond_deliveries d LEFT JOIN millpond_events e ON e.id = d.event_id;

-- +goose Down
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
