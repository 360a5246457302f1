-- Blocked events become plain pending events: they are delivered, without
-- their order.
DO $$
BEGIN
    IF to_regclass('millpond_outbox') IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM information_schema.columns
                   WHERE table_schema = current_schema() AND table_name = 'millpond_outbox' AND column_name = 'ordering_key') THEN
            UPDATE millpond_outbox SET status = 'pending', settled = false WHERE status = 'blocked';
        END IF;
    END IF;
END
$$;
DROP INDEX IF EXISTS millpond_outbox_blocked_idx;
ALTER TABLE IF EXISTS millpond_outbox DROP COLUMN IF EXISTS key_released;
ALTER TABLE IF EXISTS millpond_outbox DROP COLUMN IF EXISTS ordering_seq;
ALTER TABLE IF EXISTS millpond_outbox DROP COLUMN IF EXISTS ordering_key;
DROP TABLE IF EXISTS millpond_ordering;
