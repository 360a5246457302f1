package sqlcore

import (
	"fmt"
	"strconv"
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
	claimSelect    query // MySQL: lock due rows ({ids}, and {limit} a number: after the ids, it cannot be a parameter)
	claimDead      query // MySQL: dead-letter exhausted rows of the batch ({ids})
	claimUpdate    string
	ack            query
	ackMark        query // MySQL: mark the live rows that ack locked delivered (@ids)
	ackAll         query // MySQL: acknowledge receipts of rows without an ordering key in one UPDATE (@ids, {receipts})
	fail           query
	failStatus     query
	extend         query
	extendCheck    query
	release        query
	requeue        query
	listDead       query
	purgeSelect    query // the ids to purge, oldest delivery first (PostgreSQL: locked in id order)
	purgeCount     query // how many rows purgeSelect would pick without its limit (a plain read)
	stats          query
	register       query
	unregister     query
	groupKinds     query
	existingLocked query
	dropKind       query
	deadKind       query // reroute: the kind of a dead default-group row
	kindGroups     query // reroute: the named groups that take a kind now
	copyToGroup    query // reroute: a pending copy of a row for one group
	now            query

	// Events (content stored once per event, see migration 0004).
	insertEvent      query // MySQL, SQLite: the event's content, nothing when known
	eventsByID       query // MySQL, SQLite: content of claimed rows' events ({ids})
	eventsOf         query // the events of delivery rows, by id
	deleteDeliveries query // delete delivery rows by id
	lockEvents       query // PostgreSQL, MySQL: lock events by id, in id order
	dropOrphans      query // delete the events, by id, that no delivery row points at

	// Ordering keys (see orderedEnqueue and releaseKey).
	enqueueOrdered       query // PostgreSQL: key state and rows in one statement
	enqueueOrderedNotify query
	orderedGroups        query // MySQL, SQLite: the groups an event goes to
	bumpKey              query // MySQL, SQLite: next sequence number, one more unsettled event
	keyState             query // MySQL: what bumpKey wrote
	insertOrdered        query // MySQL, SQLite: one group's row
	unbumpKey            query // undo bumpKey when the row already existed
	ackOrdered           query // PostgreSQL, SQLite: acknowledge rows with an ordering key ({pairs} on SQLite; PostgreSQL also releases their keys)
	failSkip             query // Fail under DeadLetterSkip
	releaseKeys          query // heads of keys settled: fewer unsettled ({keys} on MySQL, SQLite)
	promoteKeys          query // PostgreSQL, SQLite: the next blocked event of each key becomes pending
	ackNext              query // PostgreSQL: ack, handing the next events of the keys over (claimed)
	promoteNext          query // PostgreSQL: promoteKeys, handing the next events over
	nextBlockedDue       query // SQLite: the next blocked event of each key, and whether it can be handed over ({keys})
	handOverIDs          query // SQLite: claim the next events handed over ({ids})
	lockBlocked          query // MySQL: lock the next events to hand over ({ids})
	nextBlocked          query // MySQL: the next blocked event of each key ({keys})
	nextBlockedLocked    query // MySQL: a locking read of the next blocked event of one key (in the caller's transaction)
	promoteIDs           query // MySQL, SQLite: make those pending ({ids})
	keyUnsettled         query // MySQL: what rejoinKey wrote
	orderedDead          query // requeue: dead rows with an ordering key ({ids})
	requeueHead          query // requeue a dead row that still holds its key
	rejoinKey            query // requeue: a released dead row rejoins its key
	requeueRejoined      query
	deadOrdering         query // reroute: the ordering key of a dead default-group row

	// purgeEvents (WithDeleteOnAck) picks old events without delivery rows;
	// purgeEventsCount counts them.
	purgeEvents      query
	purgeEventsCount query

	// Held claims (PostgreSQL, see held.go).
	claimHeld   query // PostgreSQL: lock due rows, read them with their content
	heldDeliver query // settle delivered rows without an ordering key (@ids: an array; MySQL: a JSON array)
	heldLease   query // make held rows ordinary leased claims (MySQL: @pairs, a JSON array of [id, claim key])
	heldDead    query // PostgreSQL: dead-letter due rows whose attempts are used up
	heldAck     query // PostgreSQL: acknowledge held rows with an ordering key, promoting their keys' next events

	migrationsDDL string
	appliedSQL    string
	recordSQL     string
	lifecycle     lifecycleStatements // group lifecycle and dead-letter discards (groups.go)
}

const insertColsFor = "INSERT INTO millpond_deliveries (event_id, stream, consumer_group, status, available_at)\n"

// insertEventCols inserts an event's content, once whatever its groups.
const insertEventCols = "INSERT INTO millpond_events (created_at, stream, event_key, event_kind, content_hash, metadata, payload)\n"

// liveClaims (PostgreSQL) locks, in id order, the rows that the receipts
// @ids/@keys (parallel arrays) still own under a live lease: the CTE live.
// An UPDATE ... FROM unnest(...) would lock them in the order of its join
// plan, which differs between statements over the same rows, and two such
// statements (the acknowledger and the lease extender of one Subscriber)
// would deadlock. A row that a concurrent statement settles while this one
// waits for its lock is checked again after the wait and left out.
//
// The receipts, sorted by id, drive the lookup (receiptRows): each is one
// probe of the primary key, locked in turn. A join of the table with the
// receipts was planned by the row estimates instead, and where the
// statistics made the table's processing rows look rare (after a bulk
// load, or while most rows are delivered) it read the whole table and
// compared every processing row with every receipt: 1 s for 1,000
// receipts on a 20,000-row table.
const liveClaims = `WITH live AS MATERIALIZED (
  SELECT l.id FROM ` + receiptRows + `,
  LATERAL (
    SELECT o.id FROM millpond_deliveries o
    WHERE o.id = r.id AND o.claim_key = r.claim_key AND o.status = 'processing' AND o.available_at > @now%s
    FOR UPDATE OF o
  ) AS l
)`

// receiptRows (PostgreSQL) are the receipts @ids/@keys as rows r(id,
// claim_key), in id order. Joined LATERAL with a subquery that locks the
// row of r.id (a subquery with FOR UPDATE is not merged into the join),
// they make a nested loop over the receipts in this order, one primary-key
// probe and lock each, whatever the statistics say.
const receiptRows = `(SELECT * FROM unnest(@ids::BIGINT[], @keys::TEXT[]) AS u(id, claim_key) ORDER BY id) AS r`

// nextBlockedPG (PostgreSQL) is a LATERAL subquery b(id, hand) naming the
// blocked event with the lowest sequence number of the key k (stream,
// consumer_group, ordering_key), read through the blocked index, and the
// condition hand on its row b.
func nextBlockedPG(hand string) string {
	return `LATERAL (
    SELECT b.id, ` + hand + ` AS hand FROM millpond_deliveries b
    WHERE b.stream = k.stream AND b.consumer_group = k.consumer_group AND b.ordering_key = k.ordering_key
      AND b.settled AND b.delivered_at = 0 AND b.ordering_key <> '' AND b.status = 'blocked'
    ORDER BY b.ordering_seq LIMIT 1
  ) b`
}

// ackKeysPG (PostgreSQL) follows the acknowledgement's CTE live (the rows
// it settles, locked): kl locks the key rows of the live rows with an
// ordering key, in (stream, group, key) order, and returns for each n (its
// rows among live), remaining (its unsettled count once they are counted
// off) and fresh: whether the locked version is the one the statement's
// snapshot sees, told by reading the locked version's tid under the
// snapshot (a TID scan, no index probe). After waiting for a producer that
// changed the row, the lock returns the producer's version, which the
// snapshot does not see: stale. The producer's event is then invisible to
// the statement, so it must not promote that key's next event; fresh,
// every committed event of the key is visible. (A plain read of the key
// rows under the snapshot, compared with the locked ones, cost another
// probe of the key index per key.) The keys, sorted, drive the lookup (as
// receiptRows drive the receipts'): one primary-key probe and lock per key,
// in key order, whatever the statistics.
const ackKeysPG = `kl AS MATERIALIZED (
  SELECT k.stream, k.consumer_group, k.ordering_key, k.n, m.unsettled - k.n AS remaining, m.fresh
  FROM (
    SELECT stream, consumer_group, ordering_key, count(*) AS n FROM live WHERE ordering_key <> ''
    GROUP BY stream, consumer_group, ordering_key ORDER BY stream, consumer_group, ordering_key
  ) AS k,
  LATERAL (
    SELECT m.unsettled, EXISTS (SELECT FROM millpond_ordering s WHERE s.ctid = m.ctid) AS fresh
    FROM millpond_ordering m
    WHERE m.stream = k.stream AND m.consumer_group = k.consumer_group AND m.ordering_key = k.ordering_key
    FOR UPDATE OF m
  ) AS m
)`

// nextAfterAckPG (PostgreSQL) follows ackKeysPG: nxt names the next blocked
// event (id, and hand: the condition hand on the blocked row b) of each
// fresh key that keeps unsettled events, read through the blocked index.
// Those rows change only under their key row's lock, which this statement
// holds, or are deleted (a discard); the UPDATEs that promote them find
// them by id and recheck their status. (By tid they would be fetched
// without the page pruning that a visit through an index does, so their
// pages could fill with dead versions and the updates move to other pages;
// tried, the bench's WAL did not tell the two apart clearly, and the
// conservative lookup stayed.)
func nextAfterAckPG(hand string) string {
	return `nxt AS MATERIALIZED (
  SELECT b.id, b.hand FROM kl k, ` + nextBlockedPG(hand) + `
  WHERE k.fresh AND k.remaining > 0
)`
}

const handable = "(b.stream = @stream AND b.consumer_group = @group AND b.available_at <= @now AND b.attempts < @max)"

// handOverAfterAckPG (PostgreSQL) follows a CTE nxt(id, hand), such as
// nextAfterAckPG(handable) or promoteNext's, naming next events: the
// first @limit (in id order) of the next events that can be handed over
// are claimed, as a claim would (a claim key derived from @secret, the
// lease @lease, @worker, one more attempt) and returned by handed; the
// others become pending. Two UPDATEs of disjoint rows, each with one plain
// SET list (one UPDATE with a CASE per column tested each row against the
// handed ids once per column).
const handOverAfterAckPG = `
ranked AS MATERIALIZED (
  SELECT id, hand AND row_number() OVER (PARTITION BY hand ORDER BY id) <= @limit AS take FROM nxt
), handed AS (
  UPDATE millpond_deliveries o SET status = 'processing', settled = false, attempts = o.attempts + 1,
    claimed_by = @worker::VARCHAR,
    claim_key = left(encode(sha256(convert_to(@secret::TEXT || o.id::TEXT, 'UTF8')), 'hex'), 32),
    available_at = @now + @lease::BIGINT
  WHERE o.id = ANY(ARRAY(SELECT id FROM ranked WHERE take)) AND o.status = 'blocked'
  RETURNING o.id, o.event_id, o.stream, o.consumer_group, o.attempts, o.claim_key, o.available_at, o.ordering_key, o.ordering_seq
), promoted AS (
  UPDATE millpond_deliveries o SET status = 'pending', settled = false, available_at = GREATEST(o.available_at, @now)
  WHERE o.id = ANY(ARRAY(SELECT id FROM ranked WHERE NOT take)) AND o.status = 'blocked'
)`

// promotePG (PostgreSQL) follows a CTE nxt(id) naming the next blocked
// event of each key whose head was settled, under that key row's lock: it
// makes them pending. As in handOverAfterAckPG, the UPDATE locks the rows
// itself, through the primary key, with no separate lock step (locked first
// by a SELECT ... FOR UPDATE in id order, each row cost one more WAL record
// and one more visit; these rows are blocked and their keys' rows locked by
// this transaction, so only a discard of the group's undelivered rows, in id
// order, locks them too: a deadlock the database resolves and the store
// retries).
const promotePG = `
UPDATE millpond_deliveries o SET status = 'pending', settled = false, available_at = GREATEST(o.available_at, @now)
WHERE o.id = ANY(ARRAY(SELECT id FROM nxt)) AND o.status = 'blocked'`

// releaseCTEs (PostgreSQL) follow a CTE or subquery src(stream,
// consumer_group, ordering_key) listing settled heads (a key listed twice is
// released twice): they lock the key rows in (stream, group, key) order, the
// order every statement that locks several key rows keeps, and count the
// settled events off; dec returns each key's new unsettled count. A key
// without a row (nothing ever waited behind it) is left out.
const releaseCTEs = `,
ks AS MATERIALIZED (
  SELECT stream, consumer_group, ordering_key, count(*) AS n FROM src GROUP BY stream, consumer_group, ordering_key
), kl AS MATERIALIZED (
  SELECT m.stream, m.consumer_group, m.ordering_key, ks.n FROM millpond_ordering m
  JOIN ks ON m.stream = ks.stream AND m.consumer_group = ks.consumer_group AND m.ordering_key = ks.ordering_key
  ORDER BY m.stream, m.consumer_group, m.ordering_key
  FOR UPDATE OF m
), dec AS (
  UPDATE millpond_ordering m SET unsettled = m.unsettled - kl.n
  FROM kl WHERE m.stream = kl.stream AND m.consumer_group = kl.consumer_group AND m.ordering_key = kl.ordering_key
  RETURNING m.stream, m.consumer_group, m.ordering_key, m.unsettled
)`

const claimColumns = "id, stream, consumer_group, event_key, event_kind, payload, metadata, attempts, claim_key, available_at, created_at, ordering_key, ordering_seq"

// claimRowColumns (MySQL, SQLite) are a claimed delivery row's columns; the
// event's content is read next, by event_id (eventsByID).
const claimRowColumns = "id, stream, consumer_group, event_id, attempts, claim_key, available_at, ordering_key, ordering_seq"

// claimedColumnsSQLite are the columns SQLite's claim returns: a claimed
// row's stream and group are the request's, and are not read back (two
// strings fewer to convert and allocate per claimed row).
const claimedColumnsSQLite = "id, event_id, attempts, claim_key, available_at, ordering_key, ordering_seq, status"

// deadAt is the claim's dead-letter test for a row (prefix "o." or ""):
// its attempts are used up, and it has no ordering key or the group holds
// dead keys. Under DeadLetterSkip an exhausted row with an ordering key is
// claimed once more instead (attempts then exceed the limit) and settled by
// Core.Claim through the skip path, which promotes the next event of its key
// in the same transaction.
func deadAt(prefix, hold string) string {
	return "(" + prefix + "attempts >= @max AND (" + hold + " OR " + prefix + "ordering_key = ''))"
}

func newStatements(d Dialect) *statements { return buildStatements(d, false) }

// settling is how an acknowledgement settles a delivery row: the head of
// the statement that names the rows (its WHERE, and RETURNING, follow),
// with the alias o (pg) or none (plain). Acknowledged rows are kept,
// marked delivered, or with deleteOnAck deleted. The acknowledgements are
// written once with this head, so the two forms cannot drift apart.
//
// mysql is MySQL's whole statement up to a WHERE clause that its caller
// may extend (with AND): it settles the rows d of the ids in @ids, a JSON
// array in id order (see jsonIDs), found one by one through the primary
// key in the list's order (STRAIGHT_JOIN of the list to the table, FORCE
// INDEX on the table). It never scans the table: over a small table
// MariaDB scans a plain "DELETE ... WHERE id IN (...)" whole, and takes no
// index hint in a single-table DELETE; a locking scan waits for rows that
// other acknowledgements hold (TestMySQLListStatementsLockOnlyTheirRows).
type settling struct{ pg, plain, mysql string }

var mysqlSettleRows = mysqlRowsOf("millpond_deliveries", "d")

// mysqlRowsOf is a MySQL join of the ids in @ids (a JSON array, see
// jsonIDs) to the rows of table, aliased alias, each found through the
// primary key, in the list's order.
func mysqlRowsOf(table, alias string) string {
	return `JSON_TABLE(@ids, '$[*]' COLUMNS (id BIGINT PATH '$')) l
STRAIGHT_JOIN ` + table + " " + alias + " FORCE INDEX (PRIMARY) ON " + alias + ".id = l.id"
}

func settlingFor(deleteOnAck bool) settling {
	if deleteOnAck {
		return settling{pg: "DELETE FROM millpond_deliveries o", plain: "DELETE FROM millpond_deliveries",
			mysql: "DELETE d FROM " + mysqlSettleRows + "\nWHERE TRUE"}
	}
	return settling{
		pg:    "UPDATE millpond_deliveries o SET status = 'delivered', settled = true, delivered_at = @now",
		plain: "UPDATE millpond_deliveries SET status = 'delivered', delivered_at = @now",
		mysql: "UPDATE " + mysqlSettleRows + "\nSET d.status = 'delivered', d.delivered_at = @now\nWHERE TRUE",
	}
}

// byPK names table for a locking read by an id list: on MySQL with
// FORCE INDEX (PRIMARY), which keeps a small table from being scanned
// (see mysqlRowsOf), elsewhere as it is.
func byPK(d Dialect, table string) string {
	if d == MySQL {
		return table + " FORCE INDEX (PRIMARY)"
	}
	return table
}

// jsonIDs is ids as a JSON array, the @ids of a MySQL settling statement.
func jsonIDs(ids []int64) string {
	b := make([]byte, 0, 8*len(ids)+2)
	b = append(b, '[')
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, id, 10)
	}
	return string(append(b, ']'))
}

// buildStatements compiles the dialect's statements; with deleteOnAck the
// acknowledgements delete the rows they settle (see WithDeleteOnAck), and
// Purge also deletes old events that no delivery row points at.
func buildStatements(d Dialect, deleteOnAck bool) *statements {
	s := &statements{}
	c := d.compile
	settle := settlingFor(deleteOnAck)
	s.now = c("SELECT @now")
	// It also names the due rows whose lease expired (the others read as
	// 0), among those the claim takes, so the claim can mark them Reclaimed.
	s.anyDue = c(`SELECT CASE WHEN status = 'processing' THEN id ELSE 0 END FROM millpond_deliveries
WHERE stream = @stream AND consumer_group = @group AND status IN ('pending', 'processing') AND available_at <= @now AND id > @after
ORDER BY id LIMIT @limit`)
	// MySQL keeps a row's state in its phase index as a number (see its
	// migration 0007): 1 pending or processing, 2 blocked, 3 dead_letter,
	// 4 delivered. Its reads of a group's rows by state name the phase too,
	// so that they read that state's range of the index.
	deadPhase := ""
	if d == MySQL {
		deadPhase = "d.phase = 3 AND "
	}
	s.listDead = c(`SELECT d.id, d.stream, d.consumer_group, e.event_key, e.event_kind, d.attempts, d.last_error, e.created_at
FROM millpond_deliveries d JOIN millpond_events e ON e.id = d.event_id
WHERE ` + deadPhase + `d.status = 'dead_letter' AND d.stream = @stream AND (@all_groups OR d.consumer_group = @group) AND d.id > @after
ORDER BY d.id LIMIT @limit`)
	s.eventsByID = c("SELECT id, event_key, event_kind, payload, metadata, created_at FROM millpond_events WHERE id IN ({ids})")
	s.eventsOf = c("SELECT DISTINCT event_id FROM millpond_deliveries WHERE id IN ({ids})")
	s.deleteDeliveries = c("DELETE FROM millpond_deliveries WHERE id IN ({ids})")
	s.lockEvents = c("SELECT id FROM " + byPK(d, "millpond_events") + " WHERE id IN ({ids}) ORDER BY id FOR UPDATE")
	s.dropOrphans = c("DELETE FROM millpond_events WHERE id IN ({ids}) AND NOT EXISTS (SELECT 1 FROM millpond_deliveries d WHERE d.event_id = millpond_events.id)")
	if d == MySQL {
		// Through the primary key, never a scan (see mysqlRowsOf).
		s.dropOrphans = c("DELETE e FROM " + mysqlRowsOf("millpond_events", "e") + `
WHERE NOT EXISTS (SELECT 1 FROM millpond_deliveries d WHERE d.event_id = e.id)`)
	}
	// On MySQL no index leads with status (see its migration 0005): the
	// undelivered rows are those of delivered_at 0, read through the
	// index on delivered_at.
	undelivered := ""
	if d == MySQL {
		undelivered = " AND d.delivered_at = 0"
	}
	s.stats = c(`SELECT d.stream, d.consumer_group,
  SUM(CASE WHEN d.status = 'pending' THEN 1 ELSE 0 END),
  SUM(CASE WHEN d.status = 'processing' THEN 1 ELSE 0 END),
  SUM(CASE WHEN d.status = 'dead_letter' THEN 1 ELSE 0 END),
  SUM(CASE WHEN d.status = 'pending' AND d.attempts > 0 THEN 1 ELSE 0 END),
  COALESCE(MIN(CASE WHEN d.status IN ('pending', 'processing', 'blocked') THEN e.created_at END), 0),
  MAX(@now),
  SUM(CASE WHEN d.status = 'blocked' THEN 1 ELSE 0 END),
  SUM(CASE WHEN d.status = 'dead_letter' AND d.ordering_key <> '' AND NOT d.key_released THEN 1 ELSE 0 END)
FROM millpond_deliveries d JOIN millpond_events e ON e.id = d.event_id
WHERE d.status IN ('pending', 'processing', 'dead_letter', 'blocked')` + undelivered + `
GROUP BY d.stream, d.consumer_group
ORDER BY d.stream, d.consumer_group`)
	s.orderedGroups = c(`SELECT DISTINCT consumer_group FROM millpond_subscriptions WHERE stream = @stream AND event_kind IN ('', @kind)
ORDER BY consumer_group`)
	s.unbumpKey = c(`UPDATE millpond_ordering SET last_seq = last_seq - 1, unsettled = unsettled - 1
WHERE stream = @stream AND consumer_group = @group AND ordering_key = @okey`)
	lockDead := ""
	if d != SQLite {
		lockDead = "\nFOR UPDATE"
	}
	idList := "id IN ({ids})"
	if d == Postgres {
		idList = "id = ANY(@ids::BIGINT[])"
	}
	s.orderedDead = c(`SELECT id, consumer_group, ordering_key, key_released FROM ` + byPK(d, "millpond_deliveries") + `
WHERE status = 'dead_letter' AND stream = @stream AND ordering_key <> '' AND ` + idList + `
ORDER BY id` + lockDead)
	s.deadOrdering = c("SELECT ordering_key, key_released FROM millpond_deliveries WHERE id = @id")
	if d == Postgres {
		s.rejoinKey = c(`INSERT INTO millpond_ordering (stream, consumer_group, ordering_key, last_seq, unsettled)
VALUES (@stream, @group, @okey, 0, 1)
ON CONFLICT (stream, consumer_group, ordering_key) DO UPDATE SET unsettled = millpond_ordering.unsettled + 1
RETURNING unsettled`)
	}
	s.unregister = c("DELETE FROM millpond_subscriptions WHERE stream = @stream AND consumer_group = @group")
	// Reroute's locking read of a dead default-group row: a second Reroute,
	// a discard or a requeue of it waits, then sees it gone or changed.
	lockDeadRow := map[Dialect]string{Postgres: "\nFOR UPDATE OF d", MySQL: "\nFOR UPDATE"}[d]
	s.deadKind = c(`SELECT e.event_kind FROM millpond_deliveries d JOIN millpond_events e ON e.id = d.event_id
WHERE d.id = @id AND d.stream = @stream AND d.consumer_group = '' AND d.status = 'dead_letter'` + lockDeadRow)
	s.kindGroups = c(fmt.Sprintf(takersOf, "@kind"))
	copyRow := insertColsFor + `SELECT src.event_id, src.stream, @group, 'pending', @now
FROM millpond_deliveries src WHERE src.id = @id`
	switch d {
	case Postgres:
		s.claimHeld, s.heldLease, s.heldDead = c(heldClaimPG), c(heldLeasePG), c(heldDeadPG)
		s.heldDeliver = c(heldDeliverPG)
		if deleteOnAck {
			s.heldDeliver = c(heldDeletePG)
		}
		s.copyToGroup = c(strings.Replace(copyRow, "@group", "@group::VARCHAR", 1) + "\nON CONFLICT (event_id, consumer_group) DO NOTHING")
		s.eventsOf = c("SELECT DISTINCT event_id FROM millpond_deliveries WHERE id = ANY(@ids::BIGINT[])")
		s.deleteDeliveries = c("DELETE FROM millpond_deliveries WHERE id = ANY(@ids::BIGINT[])")
		s.lockEvents = c("SELECT id FROM millpond_events WHERE id = ANY(@ids::BIGINT[]) ORDER BY id FOR UPDATE")
		s.dropOrphans = c("DELETE FROM millpond_events e WHERE e.id = ANY(@ids::BIGINT[]) AND NOT EXISTS (SELECT 1 FROM millpond_deliveries d WHERE d.event_id = e.id)")
	case MySQL:
		s.copyToGroup = c(copyRow + "\nON DUPLICATE KEY UPDATE millpond_deliveries.id = millpond_deliveries.id")
	default:
		s.copyToGroup = c(copyRow + "\nON CONFLICT (event_id, consumer_group) DO NOTHING")
		s.lockEvents = query{} // one writer: nothing to lock
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
	// The id reported for a known event is its first delivery row's.
	known := `SELECT COALESCE((SELECT MIN(d.id) FROM millpond_deliveries d WHERE d.event_id = k.id), 0), k.content_hash
FROM millpond_events k WHERE k.stream = @stream AND k.event_key = @key`
	s.existing = c(known)
	// MySQL in REPEATABLE READ: after waiting on a concurrent insert of the
	// same key, a plain read would still see the old snapshot (no row); a
	// locking read sees the committed one. It is run only when the plain
	// read (existing) finds no event: it share-locks the gap after the
	// event's delivery rows, where concurrent enqueues insert (see
	// Core.existing).
	// (A locking read does not lock, nor read the latest rows of, a
	// subquery: the rows are joined.)
	s.existingLocked = c(`SELECT COALESCE(MIN(d.id), 0), k.content_hash
FROM millpond_events k LEFT JOIN millpond_deliveries d ON d.event_id = k.id
WHERE k.stream = @stream AND k.event_key = @key
GROUP BY k.id, k.content_hash LOCK IN SHARE MODE`)
	insertCols := insertColsFor

	// purgeable is what purgeSelect picks (without its limit), as a
	// condition on a delivery row.
	var purgeable string
	switch d {
	case Postgres:
		// The groups are read once, outer-joined to the new event: no group
		// takes the kind, the join gives one row with no group, the default
		// group's (COALESCE). A known event inserts nothing: its content
		// stays as first enqueued, and no group gets a row for it.
		// (This shape, rather than a CTE of the groups with a UNION ALL of
		// the default when it is empty, spares every enqueue a CTE scan, an
		// Append and an InitPlan: about 3% of the database's instructions
		// per enqueue transaction, with one group as with eight. DISTINCT
		// stays: a group subscribed to every kind and to the event's kind
		// has two subscription rows.)
		enqueue := `WITH ev AS (
  ` + insertEventCols + `  VALUES (@now, @stream::VARCHAR, @key::VARCHAR, @kind::VARCHAR, @hash::BYTEA, @metadata::TEXT, @payload::BYTEA)
  ON CONFLICT (stream, event_key) DO NOTHING
  RETURNING id)%s
` + insertCols + `SELECT ev.id, @stream::VARCHAR, COALESCE(g.consumer_group, ''), 'pending', @now + @delay::BIGINT
FROM ev LEFT JOIN (
  SELECT DISTINCT consumer_group FROM millpond_subscriptions WHERE stream = @stream AND event_kind IN ('', @kind::VARCHAR)) g ON true%s
RETURNING id`
		s.enqueue = c(fmt.Sprintf(enqueue, "", ""))
		// The same statement with the wake-up folded in, which spares the
		// producer a round trip: the n row is joined, so its pg_notify runs
		// once when the event is new. (A known event inserts nothing, the
		// join has no row, and n is never read: nothing is announced.)
		s.enqueueNotify = c(fmt.Sprintf(enqueue, `,
n AS (SELECT pg_notify('`+NotifyChannel+`', @stream::TEXT))`, ", n"))
		dead := deadAt("o.", "@hold::BOOLEAN")
		// Each row's claim key is 16 random bytes of @key_bytes (claimKeyBytes,
		// 16 for each row the claim may take, drawn by Core.Claim), in hex:
		// the row's rank among the locked ids (width_bucket, a binary search
		// of their sorted array, read once; the alias r keeps its sort key
		// from reading as a join of claimed and due rows, which
		// TestPostgresPlansDoNotDependOnStatistics looks for) picks them.
		// gen_random_uuid()
		// cost 5-10 µs a row on PostgreSQL 15, and a key derived in SQL
		// from a secret of the claim (SHA-256, as MySQL's claims do) made
		// the claim about 13% more expensive than picking its random bytes.
		// The claimed rows come back in the order the UPDATE found them
		// (usually id order): Core.Claim sorts them, which spared the claim
		// a sort of the rows with their payloads (another 20% of the
		// statement's CPU). The rows' stream and group are the request's:
		// not returned.
		// A claimed row is reclaimed when it was processing (its lease had
		// expired): the ids of those, an array read once (usually empty),
		// tell. Joined with the due rows instead, the claimed rows were
		// compared with every due row (a nested loop, planned whenever the
		// statistics made due rows look rare, as when most rows are
		// delivered): a million comparisons in a claim of 1,000.
		// id + 0 is the due index's last column (see migration 0004): the
		// planner cannot take the primary key's order instead. The UPDATE
		// finds the locked rows through the primary key (= ANY of an
		// array): joined with the CTE instead, it was planned (custom and
		// generic plans alike) as a hash join over a sequential scan of the
		// whole table, on every claim, however few rows it took.
		s.claim = c(`WITH due AS (
  SELECT id, status FROM millpond_deliveries
  WHERE stream = @stream AND consumer_group = @group AND NOT settled AND available_at <= @now AND id + 0 > @after::BIGINT
  ORDER BY id + 0 LIMIT @limit
  FOR UPDATE SKIP LOCKED
), claimed AS (
  UPDATE millpond_deliveries o SET
    status = CASE WHEN ` + dead + ` THEN 'dead_letter' ELSE 'processing' END,
    settled = ` + dead + `,
    attempts = CASE WHEN ` + dead + ` THEN o.attempts ELSE o.attempts + 1 END,
    claimed_by = @worker,
    claim_key = CASE WHEN ` + dead + ` THEN '' ELSE encode(substring(@key_bytes::BYTEA FROM width_bucket(o.id, (SELECT ARRAY(SELECT r.id FROM due r ORDER BY r.id))) * 16 - 15 FOR 16), 'hex') END,
    last_error = CASE WHEN ` + dead + ` AND o.status = 'processing' THEN '` + lastErrorLeaseExpired + `' ELSE o.last_error END,
    available_at = @now + @lease::BIGINT
  WHERE o.id = ANY(ARRAY(SELECT id FROM due))
  RETURNING o.id, o.event_id, o.stream, o.consumer_group, o.attempts, o.claim_key, o.available_at, o.ordering_key, o.ordering_seq, o.status
)
SELECT c.id, e.event_key, e.event_kind, e.payload, e.metadata, c.attempts, c.claim_key, c.available_at, e.created_at, c.ordering_key, c.ordering_seq,
  c.id = ANY(ARRAY(SELECT id FROM due WHERE status = 'processing')) AS reclaimed
FROM claimed c JOIN millpond_events e ON e.id = c.event_id WHERE c.status = 'processing'`)
		// Statements that lock several rows lock them first, in id order, in
		// a subselect (see liveClaims and receiptRows); the UPDATE then
		// finds them locked, through the primary key (= ANY of an array, as
		// the claim does: joined with the CTE, it was planned as a hash join
		// over a sequential scan of the table once the CTE's row estimate
		// was right).
		// The acknowledgement settles rows without an ordering key and,
		// in the same statement, rows with one whose key row no producer
		// changed since the statement's snapshot: it locks the key rows
		// (after the outbox rows, in key order) and checks that the locked
		// version is the snapshot's (see ackKeysPG); then every event of
		// the key that has committed is visible to the statement, so it can
		// count the head off and promote the key's next event itself
		// (found by nextAfterAckPG).
		// A key whose row changed meanwhile (a producer committed while
		// this statement waited for it) is left alone, its rows
		// unacknowledged: Core settles them with ackOrdered and
		// promoteKeys, two statements of one transaction, the second
		// seeing the producer's event.
		ack := `WITH live AS MATERIALIZED (
  SELECT l.id, l.stream, l.consumer_group, l.ordering_key FROM ` + receiptRows + `,
  LATERAL (
    SELECT o.id, o.stream, o.consumer_group, o.ordering_key FROM millpond_deliveries o
    WHERE o.id = r.id AND o.claim_key = r.claim_key AND o.status = 'processing' AND o.available_at > @now
    FOR UPDATE OF o
  ) AS l
), ` + ackKeysPG + `, acked AS (
  ` + settle.pg + `
  WHERE o.id = ANY(ARRAY(SELECT live.id FROM live
    WHERE NOT EXISTS (SELECT 1 FROM kl WHERE NOT kl.fresh AND kl.stream = live.stream AND kl.consumer_group = live.consumer_group AND kl.ordering_key = live.ordering_key)))
  RETURNING o.id
), dec AS (
  UPDATE millpond_ordering m SET unsettled = m.unsettled - kl.n
  FROM kl WHERE m.stream = kl.stream AND m.consumer_group = kl.consumer_group AND m.ordering_key = kl.ordering_key AND kl.fresh
)`
		ackTail := `, ` + nextAfterAckPG("false") + `, promoted AS (
  UPDATE millpond_deliveries o SET status = 'pending', settled = false, available_at = GREATEST(o.available_at, @now)
  WHERE o.id = ANY(ARRAY(SELECT id FROM nxt)) AND o.status = 'blocked'
)
SELECT id FROM acked`
		s.ack = c(ack + ackTail)
		// A held claim's acknowledgement of events with an ordering key
		// (see held.go): the same statement over rows its transaction
		// holds (@ids), counting the attempt and naming the worker as a
		// claim would have.
		heldSettle := settle.pg
		if !deleteOnAck {
			heldSettle += ", attempts = o.attempts + 1, claimed_by = @worker, claim_key = ''"
		}
		heldAck := heldLivePG + ", " + strings.Replace(ack[strings.Index(ack, ackKeysPG):], settle.pg, heldSettle, 1)
		s.heldAck = c(heldAck + ackTail)
		// The same acknowledgement handing the next events over (see
		// handOverAfterAckPG): it returns the events it claimed, content
		// included (handed true), and the acknowledged ids (handed false).
		// The acknowledged ids come back in one row, a comma-separated
		// list in its last column: one row per id, of as many columns as
		// a handed-over event's, cost the client about as much to read as
		// the handed-over events themselves.
		s.ackNext = c(ack + `, ` + nextAfterAckPG(handable) + `,` + handOverAfterAckPG + `
SELECT true, p.id, p.stream, p.consumer_group, e.event_key, e.event_kind, e.payload, e.metadata, p.attempts, p.claim_key, p.available_at, e.created_at, p.ordering_key, p.ordering_seq, ''
FROM handed p JOIN millpond_events e ON e.id = p.event_id
UNION ALL
SELECT false, 0, '', '', '', '', NULL, '', 0, '', 0, 0, '', 0, COALESCE((SELECT string_agg(id::TEXT, ',') FROM acked), '')`)
		// One statement settles the ordered rows and counts them off their
		// keys (outbox rows locked first, then key rows); it returns the
		// settled ids (keys empty) and the keys that still have unsettled
		// events (id 0), whose next events promoteKeys makes pending in a
		// later statement of the same transaction.
		s.ackOrdered = c(fmt.Sprintf(liveClaims, " AND o.ordering_key <> ''") + `,
acked AS (
  ` + settle.pg + `
  WHERE o.id = ANY(ARRAY(SELECT id FROM live)) AND o.ordering_key <> ''
  RETURNING o.id, o.stream, o.consumer_group, o.ordering_key
), src AS (SELECT stream, consumer_group, ordering_key FROM acked)` + releaseCTEs + `
SELECT id, '', '', '', 0 FROM acked
UNION ALL
SELECT 0, stream, consumer_group, ordering_key, unsettled FROM dec WHERE unsettled > 0`)
		s.releaseKeys = c(`WITH src AS (
  SELECT * FROM unnest(@streams::TEXT[], @groups::TEXT[], @okeys::TEXT[]) AS k(stream, consumer_group, ordering_key)
)` + releaseCTEs + `
SELECT stream, consumer_group, ordering_key FROM dec WHERE unsettled > 0`)
		// The next blocked event of each key becomes pending. Blocked
		// rows are settled (out of the claim index) but not delivered, like
		// dead letters; the blocked index holds both kinds of rows with an
		// ordering key.
		s.promoteKeys = c(`WITH nxt AS MATERIALIZED (
  SELECT b.id FROM unnest(@streams::TEXT[], @groups::TEXT[], @okeys::TEXT[]) AS k(stream, consumer_group, ordering_key),
  ` + nextBlockedPG("false") + `
)` + promotePG)
		// The same promotion handing the next events over, as an
		// acknowledgement does (see handOverAfterAckPG).
		s.promoteNext = c(`WITH nxt AS MATERIALIZED (
  SELECT b.id, b.hand FROM unnest(@streams::TEXT[], @groups::TEXT[], @okeys::TEXT[]) AS k(stream, consumer_group, ordering_key),
  ` + nextBlockedPG(handable) + `
),` + handOverAfterAckPG + `
SELECT p.id, p.stream, p.consumer_group, e.event_key, e.event_kind, e.payload, e.metadata, p.attempts, p.claim_key, p.available_at, e.created_at, p.ordering_key, p.ordering_seq
FROM handed p JOIN millpond_events e ON e.id = p.event_id`)
		s.failSkip = c(`UPDATE millpond_deliveries SET
  status = CASE WHEN attempts >= @max THEN 'dead_letter' ELSE 'pending' END,
  settled = attempts >= @max,
  attempts = LEAST(attempts, @max),
  key_released = attempts >= @max AND ordering_key <> '',
  available_at = @now + @delay::BIGINT, last_error = @reason
WHERE id = @id AND claim_key = @key AND status = 'processing' AND available_at > @now
RETURNING status, stream, consumer_group, ordering_key`)
		s.requeueHead = c(`UPDATE millpond_deliveries SET status = 'pending', settled = false, attempts = 0, available_at = @now, last_error = '', key_released = false WHERE id = @id`)
		s.requeueRejoined = c(`UPDATE millpond_deliveries SET
  status = CASE WHEN @head::BOOLEAN THEN 'pending' ELSE 'blocked' END,
  settled = NOT @head::BOOLEAN,
  attempts = 0, available_at = @now, last_error = '', key_released = false WHERE id = @id`)
		// The key state rows are locked in group order, so producers of one
		// key that fan out to several groups never deadlock on them. After
		// waiting for another producer of the key, ON CONFLICT DO UPDATE
		// reads the row's latest version; the rows' status follows from it.
		// The groups are read once and outer-joined to the new event, as
		// in the enqueue without an ordering key: no group takes the kind,
		// the join gives one row with no group, the default group's. (A
		// CTE of the groups, with a UNION ALL of the default group's row
		// when it was empty, cost 30,000 more of the database's
		// instructions per enqueue, 5% of the statement: callgrind, one
		// backend, 500 enqueues over 50 keys.)
		// The delivery rows are inserted without ON CONFLICT, as in the
		// unordered enqueue: they belong to the event this statement
		// inserted (ev), which no other transaction sees, so none can
		// exist; a speculative insertion wrote one WAL record more per row.
		// (A plain UPDATE of an existing key row, with the upsert only for
		// a key's first event, spares the upsert's lock record too, but
		// the CTEs it needs cost the backend more CPU per enqueue than the
		// record saved: measured, not kept.)
		enqueueOrdered := `WITH ev AS (
  ` + insertEventCols + `  VALUES (@now, @stream::VARCHAR, @key::VARCHAR, @kind::VARCHAR, @hash::BYTEA, @metadata::TEXT, @payload::BYTEA)
  ON CONFLICT (stream, event_key) DO NOTHING
  RETURNING id),
st AS (
  INSERT INTO millpond_ordering (stream, consumer_group, ordering_key, last_seq, unsettled)
  SELECT @stream::VARCHAR, COALESCE(g.consumer_group, ''), @okey::VARCHAR, 1, 1
  FROM ev LEFT JOIN (
    SELECT DISTINCT consumer_group FROM millpond_subscriptions WHERE stream = @stream AND event_kind IN ('', @kind::VARCHAR)) g ON true
  ORDER BY 2
  ON CONFLICT (stream, consumer_group, ordering_key) DO UPDATE
    SET last_seq = millpond_ordering.last_seq + 1, unsettled = millpond_ordering.unsettled + 1
  RETURNING consumer_group, last_seq, unsettled
)%s,
ins AS (
  INSERT INTO millpond_deliveries (event_id, stream, consumer_group, status, settled, available_at, ordering_key, ordering_seq)
  SELECT ev.id, @stream::VARCHAR, st.consumer_group,
    CASE WHEN st.unsettled = 1 THEN 'pending' ELSE 'blocked' END, st.unsettled <> 1,
    @now + @delay::BIGINT, @okey::VARCHAR, st.last_seq
  FROM ev, st%s
  RETURNING id, consumer_group
)
SELECT st.consumer_group, COALESCE(ins.id, 0) FROM st LEFT JOIN ins ON ins.consumer_group = st.consumer_group`
		s.enqueueOrdered = c(fmt.Sprintf(enqueueOrdered, "", ""))
		s.enqueueOrderedNotify = c(fmt.Sprintf(enqueueOrdered, `,
n AS (SELECT pg_notify('`+NotifyChannel+`', @stream::TEXT))`, ", n"))
		s.fail = c(`UPDATE millpond_deliveries SET
  status = CASE WHEN attempts >= @max THEN 'dead_letter' ELSE 'pending' END,
  settled = attempts >= @max,
  available_at = @now + @delay::BIGINT, last_error = @reason
WHERE id = @id AND claim_key = @key AND status = 'processing' AND available_at > @now
RETURNING status`)
		s.extend = c(fmt.Sprintf(liveClaims, "") + `
UPDATE millpond_deliveries o SET available_at = @now + @lease::BIGINT
WHERE o.id = ANY(ARRAY(SELECT id FROM live))
RETURNING o.id, o.available_at`)
		s.release = c(fmt.Sprintf(liveClaims, "") + `
UPDATE millpond_deliveries o SET status = 'pending', attempts = GREATEST(o.attempts - 1, 0), available_at = @now
WHERE o.id = ANY(ARRAY(SELECT id FROM live))`)
		s.requeue = c(`WITH dead AS (
  SELECT id FROM millpond_deliveries
  WHERE status = 'dead_letter' AND stream = @stream AND id = ANY(@ids::BIGINT[]) AND ordering_key = ''
  ORDER BY id
  FOR UPDATE
)
UPDATE millpond_deliveries o SET status = 'pending', settled = false, attempts = 0, available_at = @now, last_error = ''
FROM dead WHERE o.id = dead.id`)
		// The dead-letter index filters on settled (see the schema).
		s.listDead = c(`SELECT d.id, d.stream, d.consumer_group, e.event_key, e.event_kind, d.attempts, d.last_error, e.created_at
FROM millpond_deliveries d JOIN millpond_events e ON e.id = d.event_id
WHERE d.settled AND d.delivered_at = 0 AND d.status = 'dead_letter' AND d.stream = @stream AND (@all_groups OR d.consumer_group = @group) AND d.id > @after
ORDER BY d.id LIMIT @limit`)
		s.purgeSelect = c(`SELECT id FROM millpond_deliveries WHERE id IN (
    SELECT id FROM millpond_deliveries WHERE status = 'delivered' AND delivered_at <> 0 AND delivered_at < @now - @horizon::BIGINT
    ORDER BY delivered_at LIMIT @limit)
  AND status = 'delivered'
ORDER BY id
FOR UPDATE`)
		purgeable = "status = 'delivered' AND delivered_at <> 0 AND delivered_at < @now - @horizon::BIGINT"
		s.register = c("INSERT INTO millpond_subscriptions (stream, consumer_group, event_kind, created_at) VALUES (@stream, @group, @kind, @now) ON CONFLICT DO NOTHING")
		s.migrationsDDL = "CREATE TABLE IF NOT EXISTS millpond_schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR(128) NOT NULL, applied_at BIGINT NOT NULL)"
		s.recordSQL = "INSERT INTO millpond_schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)"

	case MySQL:
		s.heldDeliver, s.heldLease = c(heldDeliverMySQL), c(heldLeaseMySQL)
		if deleteOnAck {
			s.heldDeliver = c(heldDeleteMySQL)
		}
		s.insertEvent = c(insertEventCols + `VALUES (@now, @stream, @key, @kind, @hash, @metadata, @payload)
ON DUPLICATE KEY UPDATE id = id`)
		// One delivery row per group subscribed to the event's kind, or one
		// of the default group when none is: the event's own row (just
		// inserted, read by its primary key) left-joined with the
		// subscriptions. The derived table of groups (SELECT DISTINCT ...
		// UNION ALL ...) that the other dialects read made MariaDB build
		// two temporary tables per enqueue. A group subscribed to both
		// every kind ('') and this one is joined twice: its second row is
		// a duplicate of the first, which the unique (event_id,
		// consumer_group) turns into a no-op (the event id is new, so no
		// other row can collide).
		s.enqueue = c(insertCols + `SELECT e.id, @stream, COALESCE(s.consumer_group, ''), 'pending', @now + @delay
FROM millpond_events e LEFT JOIN millpond_subscriptions s ON s.stream = @stream AND s.event_kind IN ('', @kind)
WHERE e.id = @eid
ON DUPLICATE KEY UPDATE millpond_deliveries.id = millpond_deliveries.id`)
		// In REPEATABLE READ an INSERT ... SELECT share-locks the rows and gaps
		// it reads, so concurrent enqueues would deadlock on a known-event
		// probe inside it: the event's key is checked by the events' unique
		// index instead (insertEvent, a plain INSERT ... VALUES), and the
		// delivery rows' INSERT ... SELECT reads only the subscriptions.
		// A claim finds due rows with a plain read of the phase index, then
		// locks them through the primary key, in id order, skipping rows
		// another transaction holds. Locking while scanning the phase index
		// would hold an index entry of a row that an acknowledgement has
		// locked (MariaDB waits there despite SKIP LOCKED) while the
		// acknowledgement waits to update that entry: a deadlock.
		//
		// Pending and processing rows are one ordered range of the phase
		// index (stream, consumer_group, phase, id), phase 1 (migration
		// 0007), read in id order until @limit rows are due: a claim
		// changes status but not phase, so it moves no entry of the
		// index. Rows under a live lease below the due ones are read and
		// skipped (their available_at is in the row).
		// The index is named: with statistics not yet updated after a
		// large enqueue, the optimizer could choose the next index's
		// (stream, consumer_group) prefix and read every row of a blocked
		// key behind its head.
		s.claimDue = c(`SELECT id FROM millpond_deliveries FORCE INDEX (millpond_deliveries_phase_idx)
WHERE stream = @stream AND consumer_group = @group AND phase = 1 AND available_at <= @now AND id > @after
ORDER BY id LIMIT @limit`)
		// Not the stream and group: the ids are due rows of the request's
		// (each column read is an allocation per row in the driver).
		s.claimSelect = c(`SELECT id, event_id, attempts, claim_key, available_at, ordering_key, ordering_seq, status, @now FROM millpond_deliveries FORCE INDEX (PRIMARY)
WHERE status IN ('pending', 'processing') AND available_at <= @now AND id IN ({ids})
ORDER BY id LIMIT {limit}
FOR UPDATE SKIP LOCKED`)
		// MySQL evaluates SET assignments left to right, each seeing the
		// columns already assigned: last_error must read the old status.
		s.claimDead = c(`UPDATE millpond_deliveries FORCE INDEX (PRIMARY) SET
  last_error = CASE WHEN status = 'processing' THEN '` + lastErrorLeaseExpired + `' ELSE last_error END,
  status = 'dead_letter', claimed_by = @worker, claim_key = ''
WHERE id IN ({ids})
ORDER BY id`)
		s.claimUpdate = "UPDATE millpond_deliveries FORCE INDEX (PRIMARY) SET status = 'processing', attempts = attempts + 1, claimed_by = ?, available_at = ?, claim_key = LEFT(SHA2(CONCAT(?, id), 256), 32) WHERE id IN ({ids}) ORDER BY id"
		// Several rows are locked in id order (see inIDOrder): the lists come
		// sorted, InnoDB reads an id list in key order, and ORDER BY id says so.
		s.ack = c(`SELECT id, stream, consumer_group, ordering_key FROM millpond_deliveries FORCE INDEX (PRIMARY)
WHERE status = 'processing' AND available_at > @now AND (id, claim_key) IN ({pairs})
ORDER BY id
FOR UPDATE`)
		s.ackMark = c(settle.mysql)
		// The acknowledgement's first try (see Core.ackAllMySQL): one
		// UPDATE of the receipts' rows, in id order, that settles them when
		// every receipt is live and has no ordering key; the count of
		// changed rows then tells that all were, with no locking read
		// first. Each row's claim key is checked as the string "id:key"
		// in a list of the receipts' (see expandReceipts): MariaDB 10.11
		// compares a row value (id, claim_key) with an IN list of 1,000
		// pairs in about 3 µs per row, this string in about 1.5 µs (a
		// binary string: the comparison ignores collations).
		s.ackAll = c(settle.mysql + `
  AND d.status = 'processing' AND d.available_at > @now AND d.ordering_key = ''
  AND CAST(CONCAT(d.id, ':', d.claim_key) AS BINARY) IN ({receipts})`)
		s.fail = c(`UPDATE millpond_deliveries SET
  status = CASE WHEN attempts >= @max THEN 'dead_letter' ELSE 'pending' END,
  available_at = @now + @delay, last_error = @reason
WHERE id = @id AND claim_key = @key AND status = 'processing' AND available_at > @now`)
		s.failStatus = c("SELECT status, stream, consumer_group, ordering_key FROM millpond_deliveries WHERE id = @id")
		// MySQL assigns left to right, each expression seeing the columns
		// already assigned: attempts is assigned last.
		s.failSkip = c(`UPDATE millpond_deliveries SET
  key_released = (attempts >= @max AND ordering_key <> ''),
  status = CASE WHEN attempts >= @max THEN 'dead_letter' ELSE 'pending' END,
  available_at = @now + @delay, last_error = @reason,
  attempts = LEAST(attempts, @max)
WHERE id = @id AND claim_key = @key AND status = 'processing' AND available_at > @now`)
		// Settled heads are counted off their keys in one statement per
		// round (a key settled twice in a batch is in two rounds), locking
		// the key rows in primary-key order; then a plain read finds the
		// next blocked event of each key that still has unsettled events
		// (a new statement: in READ COMMITTED it sees every producer that
		// committed before the key rows were locked) and one statement
		// promotes them, in id order. FORCE INDEX keeps the statement on
		// primary-key ranges: over a small table MariaDB otherwise scans
		// the whole key index, locking (and waiting for) every key row it
		// passes, keys of other acknowledgements included, which
		// deadlocks concurrent acknowledgements.
		s.releaseKeys = c(`UPDATE millpond_ordering FORCE INDEX (PRIMARY) SET unsettled = unsettled - 1 WHERE {keys}
ORDER BY stream, consumer_group, ordering_key`)
		// blocked_seq is a blocked row's ordering_seq, NULL for every other
		// row (a stored column, indexed after the key: migration 0005).
		s.nextBlocked = c(`SELECT (SELECT b.id FROM millpond_deliveries b
  WHERE b.stream = k.stream AND b.consumer_group = k.consumer_group AND b.ordering_key = k.ordering_key AND b.blocked_seq IS NOT NULL
  ORDER BY b.blocked_seq LIMIT 1)
FROM millpond_ordering k WHERE k.unsettled > 0 AND {keys}`)
		s.nextBlockedLocked = c(`SELECT id FROM millpond_deliveries FORCE INDEX (millpond_deliveries_next_idx)
WHERE stream = @stream AND consumer_group = @group AND ordering_key = @okey AND blocked_seq IS NOT NULL
ORDER BY blocked_seq LIMIT 1 FOR UPDATE`)
		s.promoteIDs = c(`UPDATE millpond_deliveries FORCE INDEX (PRIMARY) SET status = 'pending', available_at = GREATEST(available_at, @now)
WHERE status = 'blocked' AND id IN ({ids})
ORDER BY id`)
		// Handing over: lock the next events (found by nextBlocked) in id
		// order, as promoteIDs would, and read what a claim returns.
		s.lockBlocked = c(`SELECT ` + claimRowColumns + ` FROM millpond_deliveries FORCE INDEX (PRIMARY)
WHERE status = 'blocked' AND id IN ({ids})
ORDER BY id
FOR UPDATE`)
		s.bumpKey = c(`INSERT INTO millpond_ordering (stream, consumer_group, ordering_key, last_seq, unsettled)
VALUES (@stream, @group, @okey, 1, 1)
ON DUPLICATE KEY UPDATE last_seq = last_seq + 1, unsettled = unsettled + 1`)
		s.keyState = c("SELECT last_seq, unsettled FROM millpond_ordering WHERE stream = @stream AND consumer_group = @group AND ordering_key = @okey")
		s.keyUnsettled = c("SELECT unsettled FROM millpond_ordering WHERE stream = @stream AND consumer_group = @group AND ordering_key = @okey")
		s.rejoinKey = c(`INSERT INTO millpond_ordering (stream, consumer_group, ordering_key, last_seq, unsettled)
VALUES (@stream, @group, @okey, 0, 1)
ON DUPLICATE KEY UPDATE unsettled = unsettled + 1`)
		s.insertOrdered = c(insertCols[:len(insertCols)-2] + `, ordering_key, ordering_seq)
VALUES (@eid, @stream, @group, @status, @now + @delay, @okey, @seq)
ON DUPLICATE KEY UPDATE millpond_deliveries.id = millpond_deliveries.id`)
		s.requeueHead = c(`UPDATE millpond_deliveries SET status = 'pending', attempts = 0, available_at = @now, last_error = '', key_released = 0 WHERE id = @id`)
		s.requeueRejoined = c(`UPDATE millpond_deliveries SET status = CASE WHEN @head THEN 'pending' ELSE 'blocked' END,
  attempts = 0, available_at = @now, last_error = '', key_released = 0 WHERE id = @id`)
		s.extend = c(`UPDATE millpond_deliveries FORCE INDEX (PRIMARY) SET available_at = @now + @lease
WHERE status = 'processing' AND available_at > @now AND (id, claim_key) IN ({pairs})
ORDER BY id`)
		s.extendCheck = c(`SELECT id, available_at FROM millpond_deliveries WHERE status = 'processing' AND available_at = @expires AND (id, claim_key) IN ({pairs})`)
		s.release = c(`UPDATE millpond_deliveries FORCE INDEX (PRIMARY) SET status = 'pending', attempts = GREATEST(attempts - 1, 0), available_at = @now
WHERE status = 'processing' AND available_at > @now AND (id, claim_key) IN ({pairs})
ORDER BY id`)
		s.requeue = c(`UPDATE millpond_deliveries FORCE INDEX (PRIMARY) SET status = 'pending', attempts = 0, available_at = @now, last_error = ''
WHERE status = 'dead_letter' AND stream = @stream AND ordering_key = '' AND id IN ({ids})
ORDER BY id`)
		// Purge picks the oldest deliveries with a plain read, then deletes
		// them by id, in id order: a DELETE ... ORDER BY delivered_at would
		// lock rows in delivery order.
		s.purgeSelect = c(`SELECT id FROM millpond_deliveries WHERE delivered_at > 0 AND delivered_at < @now - @horizon AND status = 'delivered' ORDER BY delivered_at LIMIT @limit`)
		purgeable = "delivered_at > 0 AND delivered_at < @now - @horizon AND status = 'delivered'"
		s.deleteDeliveries = c("DELETE d FROM " + mysqlSettleRows)
		s.register = c("INSERT INTO millpond_subscriptions (stream, consumer_group, event_kind, created_at) VALUES (@stream, @group, @kind, @now) ON DUPLICATE KEY UPDATE stream = stream")
		s.migrationsDDL = "CREATE TABLE IF NOT EXISTS millpond_schema_migrations (version INT PRIMARY KEY, name VARCHAR(128) NOT NULL, applied_at BIGINT NOT NULL) ENGINE=InnoDB"
		s.recordSQL = "INSERT INTO millpond_schema_migrations (version, name, applied_at) VALUES (?, ?, ?)"

	case SQLite:
		// Enqueue's inserts run without RETURNING (which made each a query
		// whose rows the driver buffers and the store scans): the event's
		// id is the connection's last rowid, and the delivery rows of one
		// INSERT ... SELECT take consecutive ids (the id is an INTEGER
		// PRIMARY KEY AUTOINCREMENT: a new one is one more than the
		// largest ever used, and the single writer holds the table), the
		// first being the last rowid minus the rows inserted, plus one.
		s.insertEvent = c(insertEventCols + `VALUES (@now, @stream, @key, @kind, @hash, @metadata, @payload)
ON CONFLICT (stream, event_key) DO NOTHING`)
		s.enqueue = c(insertCols + `SELECT @eid, @stream, g.consumer_group, 'pending', @now + @delay
FROM (` + strings.Replace(groups, "%s", "", 1) + `) AS g`)
		dead := deadAt("", "@hold")
		s.claim = c(`UPDATE millpond_deliveries SET
  status = CASE WHEN ` + dead + ` THEN 'dead_letter' ELSE 'processing' END,
  attempts = CASE WHEN ` + dead + ` THEN attempts ELSE attempts + 1 END,
  claimed_by = @worker,
  claim_key = CASE WHEN ` + dead + ` THEN '' ELSE lower(hex(randomblob(16))) END,
  last_error = CASE WHEN ` + dead + ` AND status = 'processing' THEN '` + lastErrorLeaseExpired + `' ELSE last_error END,
  available_at = @now + @lease
WHERE id IN (
  SELECT id FROM millpond_deliveries
  WHERE stream = @stream AND consumer_group = @group AND status IN ('pending', 'processing') AND available_at <= @now AND id > @after
  ORDER BY id LIMIT @limit)
RETURNING ` + claimedColumnsSQLite)
		s.ack = c(settle.plain + `
WHERE status = 'processing' AND available_at > @now AND ordering_key = '' AND (id, claim_key) IN ({pairs})
RETURNING id`)
		s.ackOrdered = c(settle.plain + `
WHERE status = 'processing' AND available_at > @now AND ordering_key <> '' AND (id, claim_key) IN ({pairs})
RETURNING id, stream, consumer_group, ordering_key`)
		s.failSkip = c(`UPDATE millpond_deliveries SET
  status = CASE WHEN attempts >= @max THEN 'dead_letter' ELSE 'pending' END,
  attempts = MIN(attempts, @max),
  key_released = (attempts >= @max AND ordering_key <> ''),
  available_at = @now + @delay, last_error = @reason
WHERE id = @id AND claim_key = @key AND status = 'processing' AND available_at > @now
RETURNING status, stream, consumer_group, ordering_key`)
		// One writer at a time: settled heads are counted off their keys,
		// one statement per round (a key settled twice in a batch is in two
		// rounds), then one statement promotes the next blocked event of
		// each key that still has unsettled events.
		s.releaseKeys = c(`UPDATE millpond_ordering SET unsettled = unsettled - 1 WHERE {keys}`)
		s.promoteKeys = c(`UPDATE millpond_deliveries SET status = 'pending', available_at = MAX(available_at, @now)
WHERE status = 'blocked' AND id IN (
  SELECT (SELECT b.id FROM millpond_deliveries b
    WHERE b.stream = k.stream AND b.consumer_group = k.consumer_group AND b.ordering_key = k.ordering_key AND b.status = 'blocked'
    ORDER BY b.ordering_seq LIMIT 1)
  FROM millpond_ordering k WHERE k.unsettled > 0 AND {keys})`)
		// Handing over (see Core.AcknowledgeAndClaimNext): the next
		// blocked event of each key, whether it can be claimed for the
		// acknowledging consumer, then one statement claims those and one
		// makes the others pending.
		s.nextBlockedDue = c(`SELECT b.id, b.stream = @stream AND b.consumer_group = @group AND b.available_at <= @now AND b.attempts < @max
FROM millpond_deliveries b WHERE b.status = 'blocked' AND b.id IN (
  SELECT (SELECT x.id FROM millpond_deliveries x
    WHERE x.stream = k.stream AND x.consumer_group = k.consumer_group AND x.ordering_key = k.ordering_key AND x.status = 'blocked'
    ORDER BY x.ordering_seq LIMIT 1)
  FROM millpond_ordering k WHERE k.unsettled > 0 AND {keys})
ORDER BY b.id`)
		s.handOverIDs = c(`UPDATE millpond_deliveries SET status = 'processing', attempts = attempts + 1, claimed_by = @worker,
  claim_key = lower(hex(randomblob(16))), available_at = @now + @lease
WHERE status = 'blocked' AND id IN ({ids})
RETURNING ` + claimRowColumns)
		s.promoteIDs = c(`UPDATE millpond_deliveries SET status = 'pending', available_at = MAX(available_at, @now)
WHERE status = 'blocked' AND id IN ({ids})`)
		s.bumpKey = c(`INSERT INTO millpond_ordering (stream, consumer_group, ordering_key, last_seq, unsettled)
VALUES (@stream, @group, @okey, 1, 1)
ON CONFLICT (stream, consumer_group, ordering_key) DO UPDATE SET last_seq = last_seq + 1, unsettled = unsettled + 1
RETURNING last_seq, unsettled`)
		s.rejoinKey = c(`INSERT INTO millpond_ordering (stream, consumer_group, ordering_key, last_seq, unsettled)
VALUES (@stream, @group, @okey, 0, 1)
ON CONFLICT (stream, consumer_group, ordering_key) DO UPDATE SET unsettled = unsettled + 1
RETURNING unsettled`)
		s.insertOrdered = c(insertCols[:len(insertCols)-2] + `, ordering_key, ordering_seq)
VALUES (@eid, @stream, @group, @status, @now + @delay, @okey, @seq)
ON CONFLICT (event_id, consumer_group) DO NOTHING`)
		s.requeueHead = c(`UPDATE millpond_deliveries SET status = 'pending', attempts = 0, available_at = @now, last_error = '', key_released = 0 WHERE id = @id`)
		s.requeueRejoined = c(`UPDATE millpond_deliveries SET status = CASE WHEN @head THEN 'pending' ELSE 'blocked' END,
  attempts = 0, available_at = @now, last_error = '', key_released = 0 WHERE id = @id`)
		s.fail = c(`UPDATE millpond_deliveries SET
  status = CASE WHEN attempts >= @max THEN 'dead_letter' ELSE 'pending' END,
  available_at = @now + @delay, last_error = @reason
WHERE id = @id AND claim_key = @key AND status = 'processing' AND available_at > @now
RETURNING status`)
		s.extend = c(`UPDATE millpond_deliveries SET available_at = @now + @lease
WHERE status = 'processing' AND available_at > @now AND (id, claim_key) IN ({pairs})
RETURNING id, available_at`)
		s.release = c(`UPDATE millpond_deliveries SET status = 'pending', attempts = MAX(attempts - 1, 0), available_at = @now
WHERE status = 'processing' AND available_at > @now AND (id, claim_key) IN ({pairs})`)
		s.requeue = c(`UPDATE millpond_deliveries SET status = 'pending', attempts = 0, available_at = @now, last_error = ''
WHERE status = 'dead_letter' AND stream = @stream AND ordering_key = '' AND id IN ({ids})`)
		s.purgeSelect = c(`SELECT id FROM millpond_deliveries WHERE status = 'delivered' AND delivered_at < @now - @horizon
ORDER BY delivered_at LIMIT @limit`)
		purgeable = "status = 'delivered' AND delivered_at < @now - @horizon"
		s.register = c("INSERT INTO millpond_subscriptions (stream, consumer_group, event_kind, created_at) VALUES (@stream, @group, @kind, @now) ON CONFLICT DO NOTHING")
		s.migrationsDDL = "CREATE TABLE IF NOT EXISTS millpond_schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)"
		s.recordSQL = "INSERT INTO millpond_schema_migrations (version, name, applied_at) VALUES (?, ?, ?)"
	}
	// With deleteOnAck an acknowledged event keeps no delivery row, but
	// its event row stays (it is the idempotency key) until Purge: the
	// events created before the horizon that no delivery row points at,
	// in id order (no index on created_at: the primary key is read from
	// the lowest id, up to the first event created after the horizon, so
	// a Purge with nothing to do reads only the events older than the
	// horizon that still have rows; an event whose clock ran behind a
	// younger id waits for a later Purge). Deleted by dropOrphans, which
	// checks again that no row points at them.
	s.purgeCount = c(`SELECT COUNT(*) FROM millpond_deliveries WHERE ` + purgeable)
	if deleteOnAck {
		cast := ""
		if d == Postgres {
			cast = "::BIGINT"
		}
		orphans := `FROM millpond_events e
WHERE e.id < COALESCE((SELECT MIN(y.id) FROM millpond_events y WHERE y.created_at >= @now - @horizon` + cast + `), 9223372036854775807)
  AND e.created_at < @now - @horizon` + cast + `
  AND NOT EXISTS (SELECT 1 FROM millpond_deliveries d WHERE d.event_id = e.id)`
		s.purgeEvents = c(`SELECT e.id ` + orphans + `
ORDER BY e.id LIMIT @limit`)
		// Counted: the events without rows, and those whose every row
		// Purge deletes first (rows delivered before WithDeleteOnAck was
		// set), which it then deletes as well.
		s.purgeEventsCount = c(`SELECT COUNT(*) FROM millpond_events e
WHERE e.id < COALESCE((SELECT MIN(y.id) FROM millpond_events y WHERE y.created_at >= @now - @horizon` + cast + `), 9223372036854775807)
  AND e.created_at < @now - @horizon` + cast + `
  AND NOT EXISTS (SELECT 1 FROM millpond_deliveries d WHERE d.event_id = e.id AND NOT (` + purgeable + `))`)
	}
	s.lifecycle = newLifecycleStatements(d)
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

// expandReceipts fills {receipts} with one "id:claim_key" string per
// receipt (MySQL) and returns them as the extra arguments. The id is
// decimal and the key hex, so the string names one (id, key) pair.
func expandReceipts(text string, rs []Receipt) (string, []any) {
	args := make([]any, len(rs))
	for i, r := range rs {
		args[i] = strconv.FormatInt(r.ID, 10) + ":" + r.ClaimKey
	}
	marks := strings.TrimSuffix(strings.Repeat("?, ", len(rs)), ", ")
	return strings.Replace(text, "{receipts}", marks, 1), args
}

// expandKeys fills {keys} with a condition on the columns stream,
// consumer_group and ordering_key that holds for the keys ks (sorted, no
// duplicates) and returns the extra arguments: a row-value list on SQLite;
// on MySQL one primary-key range per (stream, group), which InnoDB reads in
// key order.
func expandKeys(d Dialect, text string, ks []orderKey) (string, []any) {
	var b strings.Builder
	var args []any
	if d == SQLite {
		b.WriteString("(stream, consumer_group, ordering_key) IN (VALUES ")
		for i, k := range ks {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString("(?, ?, ?)")
			args = append(args, k.stream, k.group, k.key)
		}
		b.WriteString(")")
		return strings.Replace(text, "{keys}", b.String(), 1), args
	}
	b.WriteString("(")
	for i := 0; i < len(ks); {
		j := i
		for j < len(ks) && ks[j].stream == ks[i].stream && ks[j].group == ks[i].group {
			j++
		}
		if i > 0 {
			b.WriteString(" OR ")
		}
		b.WriteString("(stream = ? AND consumer_group = ? AND ordering_key IN (" + strings.TrimSuffix(strings.Repeat("?, ", j-i), ", ") + "))")
		args = append(args, ks[i].stream, ks[i].group)
		for _, k := range ks[i:j] {
			args = append(args, k.key)
		}
		i = j
	}
	b.WriteString(")")
	return strings.Replace(text, "{keys}", b.String(), 1), args
}

// expandIDs fills {ids} with n placeholders and returns the arguments.
func expandIDs(text string, ids []int64) (string, []any) {
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	return strings.Replace(text, "{ids}", strings.TrimSuffix(strings.Repeat("?, ", len(ids)), ", "), 1), args
}

// takersOf is the one definition of "the groups that take a kind now",
// shared by Reroute (dead letters of the default group) and ReroutePending
// (pending events of the default group): the named groups subscribed to the
// stream for the kind or for every kind (an empty event_kind). %s is the kind.
const takersOf = "SELECT DISTINCT consumer_group FROM millpond_subscriptions WHERE stream = @stream AND event_kind IN ('', %s) AND consumer_group <> ''"

// lifecycleStatements list, lock and delete or move the rows of a consumer
// group. Every statement that changes several rows works on ids that a
// locking read took in id order first (PostgreSQL and MySQL: SELECT … ORDER
// BY id FOR UPDATE over the primary key; SQLite has one writer), so two of
// them, or one of them and another multi-row statement that keeps the same
// order, cannot deadlock.
type lifecycleStatements struct {
	subscriptions query // every subscription row
	activity      query // per stream and group: counts by state, newest created_at and delivered_at
	groupCounts   query // one group's pending, processing and dead-lettered rows
	schemaTable   query // 1 when millpond_schema_migrations exists
	schemaVersion query // the highest recorded migration

	// Candidates: plain reads of the next ids (above @after) to act on.
	deadOfGroup      query // dead letters of a group, optionally of one kind
	unsettledOfGroup query // pending and processing rows of a group
	pendingDefault   query // pending rows of the default group whose kind a group takes now

	// Locking reads by id ({ids} or @ids), in id order, re-checking the state.
	lockDead        query // id, status, event_kind of dead letters of the stream
	lockUndelivered query // … of pending, processing or dead-lettered rows
	lockPending     query // … of pending rows of the default group

	lockKeys    query // lock a retired group's ordering-key states
	lateOrdered query // undelivered rows of a retired group with an ordering key
	forgetKeys  query // delete a retired group's ordering-key states
	copyPending query // a pending copy, for @group, of rows by id (keeps available_at)
}

func newLifecycleStatements(d Dialect) lifecycleStatements {
	c := d.compile
	var s lifecycleStatements
	s.subscriptions = c("SELECT stream, consumer_group, event_kind, created_at FROM millpond_subscriptions ORDER BY stream, consumer_group, event_kind")
	s.activity = c(`SELECT d.stream, d.consumer_group,
  SUM(CASE WHEN status IN ('pending', 'blocked') THEN 1 ELSE 0 END),
  SUM(CASE WHEN status = 'processing' THEN 1 ELSE 0 END),
  SUM(CASE WHEN status = 'dead_letter' THEN 1 ELSE 0 END),
  SUM(CASE WHEN status = 'delivered' THEN 1 ELSE 0 END),
  MAX(e.created_at), COALESCE(MAX(delivered_at), 0)
FROM millpond_deliveries d JOIN millpond_events e ON e.id = d.event_id
GROUP BY d.stream, d.consumer_group
ORDER BY d.stream, d.consumer_group`)
	s.schemaVersion = c("SELECT COALESCE(MAX(version), 0) FROM millpond_schema_migrations")

	// State predicates: PostgreSQL's indexes filter on settled (see the schema).
	// (SQLite uses its partial due index only for the index's own condition.)
	// Unsettled includes events blocked behind their ordering key (on
	// PostgreSQL those are flagged settled, to keep them out of the claim
	// index). Pending events with an ordering key stay in the default group:
	// moving them would take them out of their key's order.
	dead, unsettled, pending := "status = 'dead_letter'", "status IN ('pending', 'processing', 'blocked')", "o.status IN ('pending', 'processing') AND o.status = 'pending' AND o.ordering_key = ''"
	switch d {
	case Postgres:
		dead, unsettled, pending = "settled AND delivered_at = 0 AND status = 'dead_letter'", "(NOT settled OR status = 'blocked')", "NOT o.settled AND o.status = 'pending' AND o.ordering_key = ''"
	case MySQL:
		dead, unsettled, pending = "phase = 3 AND "+dead, "phase IN (1, 2) AND "+unsettled, "o.phase = 1 AND o.status = 'pending' AND o.ordering_key = ''"
	}
	s.deadOfGroup = c(`SELECT id FROM millpond_deliveries
WHERE ` + dead + ` AND stream = @stream AND consumer_group = @group AND id > @after
  AND (@any_kind OR EXISTS (SELECT 1 FROM millpond_events e WHERE e.id = event_id AND e.event_kind = @kind))
ORDER BY id LIMIT @limit`)
	s.unsettledOfGroup = c(`SELECT id FROM millpond_deliveries
WHERE ` + unsettled + ` AND stream = @stream AND consumer_group = @group AND id > @after
ORDER BY id LIMIT @limit`)
	s.pendingDefault = c(`SELECT o.id FROM millpond_deliveries o
WHERE ` + pending + ` AND o.stream = @stream AND o.consumer_group = '' AND o.id > @after
  AND EXISTS (` + fmt.Sprintf(takersOf, "(SELECT e.event_kind FROM millpond_events e WHERE e.id = o.event_id)") + `)
ORDER BY o.id LIMIT @limit`)

	lock := func(state string) query {
		cols := "SELECT id, status, (SELECT e.event_kind FROM millpond_events e WHERE e.id = millpond_deliveries.event_id), consumer_group, ordering_key, key_released FROM " +
			byPK(d, "millpond_deliveries") + " WHERE "
		switch d {
		case Postgres:
			return c(cols + state + " AND stream = @stream AND id = ANY(@ids::BIGINT[]) ORDER BY id FOR UPDATE")
		case MySQL:
			return c(cols + state + " AND stream = @stream AND id IN ({ids}) ORDER BY id FOR UPDATE")
		default:
			return c(cols + state + " AND stream = @stream AND id IN ({ids}) ORDER BY id")
		}
	}
	s.lockDead = lock("status = 'dead_letter'")
	s.lockUndelivered = lock("status IN ('pending', 'processing', 'blocked', 'dead_letter')")
	s.lockPending = lock("status = 'pending' AND consumer_group = '' AND ordering_key = ''")
	s.forgetKeys = c("DELETE FROM millpond_ordering WHERE stream = @stream AND consumer_group = @group")
	lockKeys := "SELECT ordering_key FROM millpond_ordering WHERE stream = @stream AND consumer_group = @group ORDER BY ordering_key"
	if d != SQLite {
		lockKeys += " FOR UPDATE"
	}
	s.lockKeys = c(lockKeys)
	s.lateOrdered = c(`SELECT id FROM millpond_deliveries
WHERE stream = @stream AND consumer_group = @group AND ordering_key <> '' AND status IN ('pending', 'processing', 'blocked', 'dead_letter')
ORDER BY id`)

	copyRows := insertColsFor + `SELECT src.event_id, src.stream, @group, 'pending', src.available_at
FROM millpond_deliveries src WHERE src.id `
	switch d {
	case Postgres:
		s.schemaTable = c("SELECT CASE WHEN to_regclass('millpond_schema_migrations') IS NULL THEN 0 ELSE 1 END")
		s.groupCounts = c(`SELECT COUNT(*) FILTER (WHERE status IN ('pending', 'blocked')), COUNT(*) FILTER (WHERE status = 'processing'), COUNT(*) FILTER (WHERE status = 'dead_letter')
FROM millpond_deliveries WHERE stream = @stream AND consumer_group = @group AND (NOT settled OR delivered_at = 0)`)
		s.copyPending = c(strings.Replace(copyRows, "@group", "@group::VARCHAR", 1) + "= ANY(@ids::BIGINT[])\nON CONFLICT (event_id, consumer_group) DO NOTHING")
	case MySQL:
		s.schemaTable = c("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = 'millpond_schema_migrations'")
		s.copyPending = c(copyRows + "IN ({ids})\nON DUPLICATE KEY UPDATE millpond_deliveries.id = millpond_deliveries.id")
	default:
		s.schemaTable = c("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'millpond_schema_migrations'")
		s.copyPending = c(copyRows + "IN ({ids})\nON CONFLICT (event_id, consumer_group) DO NOTHING")
	}
	if d != Postgres {
		phases := ""
		if d == MySQL {
			phases = " AND phase IN (1, 2, 3)"
		}
		s.groupCounts = c(`SELECT COALESCE(SUM(CASE WHEN status IN ('pending', 'blocked') THEN 1 ELSE 0 END), 0),
  COALESCE(SUM(CASE WHEN status = 'processing' THEN 1 ELSE 0 END), 0),
  COALESCE(SUM(CASE WHEN status = 'dead_letter' THEN 1 ELSE 0 END), 0)
FROM millpond_deliveries WHERE stream = @stream AND consumer_group = @group AND status IN ('pending', 'blocked', 'processing', 'dead_letter')` + phases)
	}
	return s
}
