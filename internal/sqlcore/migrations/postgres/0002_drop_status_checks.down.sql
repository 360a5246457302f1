-- Idempotent, like every down step: MigrateDown may run on a schema that
-- is already gone.
DO $$
BEGIN
    IF to_regclass('millpond_outbox') IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM pg_constraint
                       WHERE conrelid = to_regclass('millpond_outbox') AND conname = 'millpond_outbox_status_check') THEN
        ALTER TABLE millpond_outbox ADD CONSTRAINT millpond_outbox_status_check
            CHECK (status IN ('pending', 'processing', 'delivered', 'dead_letter'));
        ALTER TABLE millpond_outbox ADD CONSTRAINT millpond_outbox_settled_check
            CHECK (settled = (status IN ('delivered', 'dead_letter')));
    END IF;
END
$$;
