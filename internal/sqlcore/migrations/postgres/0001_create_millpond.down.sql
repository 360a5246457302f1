DROP TABLE IF EXISTS millpond_outbox;
DROP FUNCTION IF EXISTS millpond_outbox_notify();
DROP TABLE IF EXISTS millpond_subscriptions;
