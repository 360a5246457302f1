DROP TABLE IF EXISTS millpond_outbox;
DROP TABLE IF EXISTS millpond_subscriptions;
