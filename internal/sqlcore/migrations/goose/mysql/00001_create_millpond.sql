-- Generated from the golang-migrate files of this dialect; keep in step
-- (go test ./internal/sqlcore -run TestGooseMigrations -update-goose).

-- +goose Up
CREATE TABLE IF NOT EXISTS millpond_outbox (
    id             BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    stream         VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    consumer_group VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '',
    event_key      VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    event_kind     VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    payload        LONGBLOB NOT NULL,
    metadata       MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    content_hash   BINARY(32) NOT NULL,
    status         VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    attempts       INT NOT NULL DEFAULT 0,
    claimed_by     VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '',
    claim_key      VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '',
    available_at   BIGINT NOT NULL,
    created_at     BIGINT NOT NULL,
    delivered_at   BIGINT NULL,
    last_error     VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '',
    UNIQUE KEY millpond_outbox_event_unique (stream, event_key, consumer_group),
    KEY millpond_outbox_due_idx (stream, consumer_group, status, id),
    KEY millpond_outbox_delivered_idx (status, delivered_at)
) ENGINE=InnoDB;
CREATE TABLE IF NOT EXISTS millpond_subscriptions (
    stream         VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    consumer_group VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    event_kind     VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '',
    created_at     BIGINT NOT NULL,
    PRIMARY KEY (stream, consumer_group, event_kind)
) ENGINE=InnoDB;

-- +goose Down
DROP TABLE IF EXISTS millpond_outbox;
DROP TABLE IF EXISTS millpond_subscriptions;
