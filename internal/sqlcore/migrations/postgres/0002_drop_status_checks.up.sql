-- PostgreSQL re-reads and re-plans a table's CHECK constraints from their
-- stored text on every INSERT and UPDATE statement; for the outbox these two
-- cost about 7% of the server's time per enqueue (perf, single producer).
-- Every statement that writes status also writes settled, from the same
-- condition (see internal/sqlcore/statements.go), so the constraints only
-- guarded against hand-written updates. millpond's own repair tools
-- (Requeue, Reroute, Purge, the millpond command) keep the pair consistent.
ALTER TABLE millpond_outbox DROP CONSTRAINT IF EXISTS millpond_outbox_status_check;
ALTER TABLE millpond_outbox DROP CONSTRAINT IF EXISTS millpond_outbox_settled_check;
