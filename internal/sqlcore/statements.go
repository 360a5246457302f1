package sqlcore

import (
	"fmt"
	"strings"
)

// Every SQL statement of the outbox lives in this file. Templates use @name
// parameters (see Dialect.compile); {pairs} and {ids} mark lists of receipts
// or ids that MySQL and SQLite expand at run time, always at the end of the
// statement so their arguments follow the compiled ones.

const lastErrorLeaseExpired = "lease expired after the final attempt"

type statements struct {
	enqueue        query
	enqueueNotify  query // PostgreSQL: enqueue and queue a NOTIFY, in one statement
	existing       query
	claim          query // PostgreSQL and SQLite: one statement
	anyDue         query // SQLite: a read that spares idle claims the write lock
	claimDue       query // MySQL: find due rows ({ids} of claimSelect)
	claimSelect    query // MySQL: lock due rows
	claimDead      query // MySQL: dead-letter exhausted rows of the batch ({ids})
	claimUpdate    string
	ack            query
	ackMark        query // MySQL: mark the live rows that ack locked delivered ({ids})
	fail           query
	failStatus     query
	extend         query
	extendCheck    query
	release        query
	requeue        query
	listDead       query
	purge          query
	purgeSelect    query // MySQL: the ids to purge, oldest delivery first
	stats          query
	register       query
	unregister     query
	groupKinds     query
	existingLocked query
	dropKind       query
	deadKind       query // reroute: the kind of a dead default-group row
	kindGroups     query // reroute: the named groups that take a kind now
	copyToGroup    query // reroute: a pending copy of a row for one group
	deleteRow      query
	now            query
	migrationsDDL  string
	appliedSQL     string
	recordSQL      string
}

const insertColsFor = "INSERT INTO millpond_outbox (stream, consumer_group, event_key, event_kind, payload, metadata, content_hash, status, available_at, created_at)\n"

// liveClaims (PostgreSQL) locks, in id order, the rows that the receipts
// @ids/@keys (parallel arrays) still own under a live lease: the CTE live.
// An UPDATE ... FROM unnest(...) would lock them in the order of its join
// plan, which differs between statements over the same rows, and two such
// statements (the acknowledger and the lease extender of one Subscriber)
// would deadlock. A row that a concurrent statement settles while this one
// waits for its lock is checked again after the wait and left out.
const liveClaims = `WITH live AS MATERIALIZED (
  SELECT o.id FROM millpond_outbox o
  JOIN unnest(@ids::BIGINT[], @keys::TEXT[]) AS r(id, claim_key) ON o.id = r.id AND o.claim_key = r.claim_key
  WHERE o.status = 'processing' AND o.available_at > @now
  ORDER BY o.id
  FOR UPDATE OF o
)`

const claimColumns = "id, stream, consumer_group, event_key, event_kind, payload, metadata, attempts, claim_key, available_at, created_at"

func newStatements(d Dialect) *statements {
	s := &statements{}
	c := d.compile
	s.now = c("SELECT @now")
	s.anyDue = c(`SELECT 1 FROM millpond_outbox
WHERE stream = @stream AND consumer_group = @group AND status IN ('pending', 'processing') AND available_at <= @now LIMIT 1`)
	s.listDead = c(`SELECT id, stream, consumer_group, event_key, event_kind, attempts, last_error, created_at
FROM millpond_outbox
WHERE status = 'dead_letter' AND stream = @stream AND (@all_groups OR consumer_group = @group) AND id > @after
ORDER BY id LIMIT @limit`)
	s.stats = c(`SELECT stream, consumer_group,
  SUM(CASE WHEN status = 'pending' THEN 1 ELSE 0 END),
  SUM(CASE WHEN status = 'processing' THEN 1 ELSE 0 END),
  SUM(CASE WHEN status = 'dead_letter' THEN 1 ELSE 0 END),
  COALESCE(MIN(CASE WHEN status IN ('pending', 'processing') THEN created_at END), 0),
  MAX(@now)
FROM millpond_outbox
WHERE status IN ('pending', 'processing', 'dead_letter')
GROUP BY stream, consumer_group
ORDER BY stream, consumer_group`)
	s.unregister = c("DELETE FROM millpond_subscriptions WHERE stream = @stream AND consumer_group = @group")
	s.deadKind = c("SELECT event_kind FROM millpond_outbox WHERE id = @id AND stream = @stream AND consumer_group = '' AND status = 'dead_letter'")
	s.kindGroups = c("SELECT DISTINCT consumer_group FROM millpond_subscriptions WHERE stream = @stream AND event_kind IN ('', @kind) AND consumer_group <> ''")
	s.deleteRow = c("DELETE FROM millpond_outbox WHERE id = @id")
	copyRow := insertColsFor + `SELECT src.stream, @group, src.event_key, src.event_kind, src.payload, src.metadata, src.content_hash, 'pending', @now, src.created_at
FROM millpond_outbox src WHERE src.id = @id`
	switch d {
	case Postgres:
		s.copyToGroup = c(strings.Replace(copyRow, "@group", "@group::VARCHAR", 1) + "\nON CONFLICT (stream, event_key, consumer_group) DO NOTHING")
	case MySQL:
		s.copyToGroup = c(copyRow + "\nON DUPLICATE KEY UPDATE millpond_outbox.id = millpond_outbox.id")
	default:
		s.copyToGroup = c(copyRow + "\nON CONFLICT (stream, event_key, consumer_group) DO NOTHING")
	}
	s.groupKinds = c("SELECT event_kind FROM millpond_subscriptions WHERE stream = @stream AND consumer_group = @group")
	s.dropKind = c("DELETE FROM millpond_subscriptions WHERE stream = @stream AND consumer_group = @group AND event_kind = @kind")
	s.appliedSQL = "SELECT version FROM millpond_schema_migrations"

	// The delivery rows of an event: one per group subscribed to the stream
	// for all kinds ('') or for the event's kind; the default group when
	// there is none, so no event is dropped.
	groups := `SELECT DISTINCT consumer_group FROM millpond_subscriptions WHERE stream = @stream AND event_kind IN ('', @kind)
  UNION ALL SELECT '' %s WHERE NOT EXISTS (SELECT 1 FROM millpond_subscriptions WHERE stream = @stream AND event_kind IN ('', @kind))`
	// An event is known when any row of the stream holds its key: enqueuing
	// it again after a group registered must neither hand the old event to
	// the new group nor skip the content check. The unique index leads with
	// (stream, event_key), so this is one index probe.
	known := `FROM millpond_outbox k WHERE k.stream = @stream AND k.event_key = @key`
	s.existing = c("SELECT k.id, k.content_hash " + known + "\nORDER BY k.id LIMIT 1")
	// MySQL in REPEATABLE READ: after waiting on a concurrent insert of the
	// same key, a plain read would still see the old snapshot (no row); a
	// locking read sees the committed one.
	s.existingLocked = c("SELECT k.id, k.content_hash " + known + "\nORDER BY k.id LIMIT 1 LOCK IN SHARE MODE")
	insertCols := insertColsFor

	switch d {
	case Postgres:
		// The groups are read once (a CTE) for the rows and for the default.
		enqueue := `WITH g AS (
  SELECT DISTINCT consumer_group FROM millpond_subscriptions WHERE stream = @stream AND event_kind IN ('', @kind::VARCHAR))%s
` + insertCols + `SELECT @stream::VARCHAR, r.consumer_group, @key::VARCHAR, @kind::VARCHAR, @payload::BYTEA, @metadata::TEXT, @hash::BYTEA, 'pending', @now + @delay::BIGINT, @now
FROM (SELECT consumer_group FROM g UNION ALL SELECT '' WHERE NOT EXISTS (SELECT 1 FROM g)) r%s
WHERE NOT EXISTS (SELECT 1 ` + known + `)
ON CONFLICT (stream, event_key, consumer_group) DO NOTHING
RETURNING id`
		s.enqueue = c(fmt.Sprintf(enqueue, "", ""))
		// The same statement with the wake-up folded in, which spares the
		// producer a round trip: the n row is joined, so its pg_notify runs
		// once, whether or not a row is inserted.
		s.enqueueNotify = c(fmt.Sprintf(enqueue, `,
n AS (SELECT pg_notify('`+NotifyChannel+`', @stream::TEXT))`, ", n"))
		s.claim = c(`WITH due AS (
  SELECT id FROM millpond_outbox
  WHERE stream = @stream AND consumer_group = @group AND NOT settled AND available_at <= @now
  ORDER BY id LIMIT @limit
  FOR UPDATE SKIP LOCKED
), claimed AS (
  UPDATE millpond_outbox o SET
    status = CASE WHEN o.attempts >= @max THEN 'dead_letter' ELSE 'processing' END,
    settled = o.attempts >= @max,
    attempts = CASE WHEN o.attempts >= @max THEN o.attempts ELSE o.attempts + 1 END,
    claimed_by = @worker,
    claim_key = CASE WHEN o.attempts >= @max THEN '' ELSE replace(gen_random_uuid()::TEXT, '-', '') END,
    last_error = CASE WHEN o.attempts >= @max AND o.status = 'processing' THEN '` + lastErrorLeaseExpired + `' ELSE o.last_error END,
    available_at = @now + @lease::BIGINT
  FROM due WHERE o.id = due.id
  RETURNING o.id, o.stream, o.consumer_group, o.event_key, o.event_kind, o.payload, o.metadata, o.attempts, o.claim_key, o.available_at, o.created_at, o.status
)
SELECT ` + claimColumns + ` FROM claimed WHERE status = 'processing' ORDER BY id`)
		// Statements that lock several rows lock them first, in id order, in
		// a subselect (see liveClaims); the UPDATE then finds them locked.
		s.ack = c(liveClaims + `
UPDATE millpond_outbox o SET status = 'delivered', settled = true, delivered_at = @now
FROM live WHERE o.id = live.id
RETURNING o.id`)
		s.fail = c(`UPDATE millpond_outbox SET
  status = CASE WHEN attempts >= @max THEN 'dead_letter' ELSE 'pending' END,
  settled = attempts >= @max,
  available_at = @now + @delay::BIGINT, last_error = @reason
WHERE id = @id AND claim_key = @key AND status = 'processing' AND available_at > @now
RETURNING status`)
		s.extend = c(liveClaims + `
UPDATE millpond_outbox o SET available_at = @now + @lease::BIGINT
FROM live WHERE o.id = live.id
RETURNING o.id, o.available_at`)
		s.release = c(liveClaims + `
UPDATE millpond_outbox o SET status = 'pending', attempts = GREATEST(o.attempts - 1, 0), available_at = @now
FROM live WHERE o.id = live.id`)
		s.requeue = c(`WITH dead AS (
  SELECT id FROM millpond_outbox
  WHERE status = 'dead_letter' AND stream = @stream AND id = ANY(@ids::BIGINT[])
  ORDER BY id
  FOR UPDATE
)
UPDATE millpond_outbox o SET status = 'pending', settled = false, attempts = 0, available_at = @now, last_error = ''
FROM dead WHERE o.id = dead.id`)
		// The dead-letter index filters on settled (see the schema).
		s.listDead = c(`SELECT id, stream, consumer_group, event_key, event_kind, attempts, last_error, created_at
FROM millpond_outbox
WHERE settled AND delivered_at IS NULL AND stream = @stream AND (@all_groups OR consumer_group = @group) AND id > @after
ORDER BY id LIMIT @limit`)
		s.purge = c(`WITH doomed AS (
  SELECT id FROM millpond_outbox WHERE id IN (
    SELECT id FROM millpond_outbox WHERE status = 'delivered' AND delivered_at < @now - @horizon::BIGINT
    ORDER BY delivered_at LIMIT @limit)
  ORDER BY id
  FOR UPDATE
)
DELETE FROM millpond_outbox o USING doomed WHERE o.id = doomed.id`)
		s.register = c("INSERT INTO millpond_subscriptions (stream, consumer_group, event_kind, created_at) VALUES (@stream, @group, @kind, @now) ON CONFLICT DO NOTHING")
		s.migrationsDDL = "CREATE TABLE IF NOT EXISTS millpond_schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR(128) NOT NULL, applied_at BIGINT NOT NULL)"
		s.recordSQL = "INSERT INTO millpond_schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)"

	case MySQL:
		s.enqueue = c(insertCols + `SELECT @stream, g.consumer_group, @key, @kind, @payload, @metadata, @hash, 'pending', @now + @delay, @now
FROM (` + strings.Replace(groups, "%s", "FROM DUAL", 1) + `) g
ON DUPLICATE KEY UPDATE millpond_outbox.id = millpond_outbox.id`)
		// In REPEATABLE READ an INSERT ... SELECT share-locks the rows and gaps
		// it reads, so concurrent enqueues would deadlock on a known-event
		// probe inside it; MySQL runs the probe first as a plain (lock-free)
		// read instead (Core.Enqueue).
		// A claim finds due rows with a plain read of the due index, then
		// locks them through the primary key, in id order, skipping rows
		// another transaction holds. Locking while scanning the due index
		// would hold an index entry of a row that an acknowledgement has
		// locked (MariaDB waits there despite SKIP LOCKED) while the
		// acknowledgement waits to update that entry: a deadlock.
		s.claimDue = c(`SELECT id FROM millpond_outbox
WHERE stream = @stream AND consumer_group = @group AND status IN ('pending', 'processing') AND available_at <= @now
ORDER BY id LIMIT @limit`)
		s.claimSelect = c(`SELECT ` + claimColumns + `, status FROM millpond_outbox FORCE INDEX (PRIMARY)
WHERE status IN ('pending', 'processing') AND available_at <= @now AND id IN ({ids})
ORDER BY id
FOR UPDATE SKIP LOCKED`)
		// MySQL evaluates SET assignments left to right, each seeing the
		// columns already assigned: last_error must read the old status.
		s.claimDead = c(`UPDATE millpond_outbox SET
  last_error = CASE WHEN status = 'processing' THEN '` + lastErrorLeaseExpired + `' ELSE last_error END,
  status = 'dead_letter', claimed_by = @worker, claim_key = ''
WHERE id IN ({ids})
ORDER BY id`)
		s.claimUpdate = "UPDATE millpond_outbox SET status = 'processing', attempts = attempts + 1, claimed_by = ?, available_at = ?, claim_key = CASE id {cases} END WHERE id IN ({ids}) ORDER BY id"
		// Several rows are locked in id order (see inIDOrder): the lists come
		// sorted, InnoDB reads an id list in key order, and ORDER BY id says so.
		s.ack = c(`SELECT id FROM millpond_outbox
WHERE status = 'processing' AND available_at > @now AND (id, claim_key) IN ({pairs})
ORDER BY id
FOR UPDATE`)
		s.ackMark = c(`UPDATE millpond_outbox SET status = 'delivered', delivered_at = @now WHERE id IN ({ids}) ORDER BY id`)
		s.fail = c(`UPDATE millpond_outbox SET
  status = CASE WHEN attempts >= @max THEN 'dead_letter' ELSE 'pending' END,
  available_at = @now + @delay, last_error = @reason
WHERE id = @id AND claim_key = @key AND status = 'processing' AND available_at > @now`)
		s.failStatus = c("SELECT status FROM millpond_outbox WHERE id = @id")
		s.extend = c(`UPDATE millpond_outbox SET available_at = @now + @lease
WHERE status = 'processing' AND available_at > @now AND (id, claim_key) IN ({pairs})
ORDER BY id`)
		s.extendCheck = c(`SELECT id, available_at FROM millpond_outbox WHERE status = 'processing' AND available_at = @expires AND (id, claim_key) IN ({pairs})`)
		s.release = c(`UPDATE millpond_outbox SET status = 'pending', attempts = GREATEST(attempts - 1, 0), available_at = @now
WHERE status = 'processing' AND available_at > @now AND (id, claim_key) IN ({pairs})
ORDER BY id`)
		s.requeue = c(`UPDATE millpond_outbox SET status = 'pending', attempts = 0, available_at = @now, last_error = ''
WHERE status = 'dead_letter' AND stream = @stream AND id IN ({ids})
ORDER BY id`)
		// Purge picks the oldest deliveries with a plain read, then deletes
		// them by id, in id order: a DELETE ... ORDER BY delivered_at would
		// lock rows in delivery order.
		s.purgeSelect = c(`SELECT id FROM millpond_outbox WHERE status = 'delivered' AND delivered_at < @now - @horizon ORDER BY delivered_at LIMIT @limit`)
		s.purge = c(`DELETE FROM millpond_outbox WHERE status = 'delivered' AND id IN ({ids}) ORDER BY id`)
		s.register = c("INSERT INTO millpond_subscriptions (stream, consumer_group, event_kind, created_at) VALUES (@stream, @group, @kind, @now) ON DUPLICATE KEY UPDATE stream = stream")
		s.migrationsDDL = "CREATE TABLE IF NOT EXISTS millpond_schema_migrations (version INT PRIMARY KEY, name VARCHAR(128) NOT NULL, applied_at BIGINT NOT NULL) ENGINE=InnoDB"
		s.recordSQL = "INSERT INTO millpond_schema_migrations (version, name, applied_at) VALUES (?, ?, ?)"

	case SQLite:
		s.enqueue = c(insertCols + `SELECT @stream, g.consumer_group, @key, @kind, @payload, @metadata, @hash, 'pending', @now + @delay, @now
FROM (` + strings.Replace(groups, "%s", "", 1) + `) AS g
WHERE NOT EXISTS (SELECT 1 ` + known + `)
ON CONFLICT (stream, event_key, consumer_group) DO NOTHING
RETURNING id`)
		s.claim = c(`UPDATE millpond_outbox SET
  status = CASE WHEN attempts >= @max THEN 'dead_letter' ELSE 'processing' END,
  attempts = CASE WHEN attempts >= @max THEN attempts ELSE attempts + 1 END,
  claimed_by = @worker,
  claim_key = CASE WHEN attempts >= @max THEN '' ELSE lower(hex(randomblob(16))) END,
  last_error = CASE WHEN attempts >= @max AND status = 'processing' THEN '` + lastErrorLeaseExpired + `' ELSE last_error END,
  available_at = @now + @lease
WHERE id IN (
  SELECT id FROM millpond_outbox
  WHERE stream = @stream AND consumer_group = @group AND status IN ('pending', 'processing') AND available_at <= @now
  ORDER BY id LIMIT @limit)
RETURNING ` + claimColumns + `, status`)
		s.ack = c(`UPDATE millpond_outbox SET status = 'delivered', delivered_at = @now
WHERE status = 'processing' AND available_at > @now AND (id, claim_key) IN ({pairs})
RETURNING id`)
		s.fail = c(`UPDATE millpond_outbox SET
  status = CASE WHEN attempts >= @max THEN 'dead_letter' ELSE 'pending' END,
  available_at = @now + @delay, last_error = @reason
WHERE id = @id AND claim_key = @key AND status = 'processing' AND available_at > @now
RETURNING status`)
		s.extend = c(`UPDATE millpond_outbox SET available_at = @now + @lease
WHERE status = 'processing' AND available_at > @now AND (id, claim_key) IN ({pairs})
RETURNING id, available_at`)
		s.release = c(`UPDATE millpond_outbox SET status = 'pending', attempts = MAX(attempts - 1, 0), available_at = @now
WHERE status = 'processing' AND available_at > @now AND (id, claim_key) IN ({pairs})`)
		s.requeue = c(`UPDATE millpond_outbox SET status = 'pending', attempts = 0, available_at = @now, last_error = ''
WHERE status = 'dead_letter' AND stream = @stream AND id IN ({ids})`)
		s.purge = c(`DELETE FROM millpond_outbox WHERE id IN (
  SELECT id FROM millpond_outbox WHERE status = 'delivered' AND delivered_at < @now - @horizon
  ORDER BY delivered_at LIMIT @limit)`)
		s.register = c("INSERT INTO millpond_subscriptions (stream, consumer_group, event_kind, created_at) VALUES (@stream, @group, @kind, @now) ON CONFLICT DO NOTHING")
		s.migrationsDDL = "CREATE TABLE IF NOT EXISTS millpond_schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)"
		s.recordSQL = "INSERT INTO millpond_schema_migrations (version, name, applied_at) VALUES (?, ?, ?)"
	}
	return s
}

// expandPairs fills {pairs} with n (id, claim_key) row values for MySQL or
// SQLite and returns the extra arguments.
func expandPairs(d Dialect, text string, rs []Receipt) (string, []any) {
	rows := make([]string, len(rs))
	args := make([]any, 0, 2*len(rs))
	for i, r := range rs {
		rows[i] = "(?, ?)"
		args = append(args, r.ID, r.ClaimKey)
	}
	list := strings.Join(rows, ", ")
	switch d {
	case SQLite:
		list = "VALUES " + list
	case MySQL:
		// MariaDB does not turn a row-value IN into a primary-key range and
		// would scan every processing row (locking them all in a locking
		// read); a plain id list first keeps it on the primary key.
		ids := make([]any, len(rs))
		for i, r := range rs {
			ids[i] = r.ID
		}
		text = strings.Replace(text, "(id, claim_key) IN ({pairs})",
			"id IN ("+strings.TrimSuffix(strings.Repeat("?, ", len(rs)), ", ")+") AND (id, claim_key) IN ({pairs})", 1)
		args = append(ids, args...)
	}
	return strings.Replace(text, "{pairs}", list, 1), args
}

// expandIDs fills {ids} with n placeholders and returns the arguments.
func expandIDs(text string, ids []int64) (string, []any) {
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	return strings.Replace(text, "{ids}", strings.TrimSuffix(strings.Repeat("?, ", len(ids)), ", "), 1), args
}
