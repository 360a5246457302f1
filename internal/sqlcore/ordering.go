package sqlcore

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Ordering keys.
//
// Every (stream, consumer group, ordering key) with events has a row in
// millpond_ordering: last_seq, the sequence number of its latest event, and
// unsettled, how many of its events the group has not settled (pending,
// processing or blocked, plus a dead letter that holds the key). Exactly
// one of those is not blocked: the head. The rest wait with status
// 'blocked', outside the claim index, so claims never walk them.
//
// Producers and settlers of a key serialise on that row:
//
//   - Enqueue takes the row's lock (an upsert: last_seq+1, unsettled+1) and
//     holds it until its transaction ends, so two producers of one key
//     commit in the order of their sequence numbers. The event is inserted
//     pending when it is the only unsettled one (unsettled is 1), blocked
//     otherwise. A rolled-back transaction rolls its increment back with it.
//   - The transaction that settles a head (acknowledgement, dead letter
//     under DeadLetterSkip, requeue, reroute) locks the same row
//     (unsettled-1) and, when events remain, promotes the blocked one with
//     the lowest sequence number to pending, in a later statement, which
//     sees every producer that committed before the lock was granted.
//
// So a producer either commits before the settler locks the row (the
// settler then sees and promotes its event) or locks the row after the
// settler committed (it then sees unsettled 0 and inserts its event
// pending).
//
// An acknowledgement made with AcknowledgeAndClaimNext hands the promoted
// event over instead: when it belongs to the acknowledging consumer's
// stream and group, is due and has attempts left, the same statement
// (PostgreSQL) or transaction (MySQL, SQLite) claims it for
// that consumer, as Claim would, rather than making it pending. The key's
// new head is then claimed from the moment it becomes the head, so at
// most one event of the key is still claimed or in flight per group, and
// its lease expiring delivers that same head again. It saves the promoted
// row a second rewrite and the consumer a claim (and, on PostgreSQL, the
// NOTIFY that a row becoming pending sends). Outbox rows are locked before key rows everywhere but in
// Enqueue, which locks only rows it inserts.

// orderKey names one key's state row.
type orderKey struct{ stream, group, key string }

func compareOrderKeys(a, b orderKey) int {
	return cmp.Or(cmp.Compare(a.stream, b.stream), cmp.Compare(a.group, b.group), cmp.Compare(a.key, b.key))
}

// enqueueOrdered records an event with an ordering key; see Enqueue.
func (c *Core) enqueueOrdered(ctx context.Context, tx Executor, ev Event, payload []byte, md string, hash []byte, notify bool) (Enqueued, error) {
	vals := map[string]any{
		"stream": ev.Stream, "key": ev.Key, "kind": ev.Kind, "payload": payload, "metadata": md,
		"hash": hash, "now": c.nowArg(), "delay": micros(ev.Delay), "okey": ev.OrderingKey,
	}
	var id int64
	var lost []string // groups whose row already existed: their key state is put back
	if c.dialect == Postgres {
		stmt := c.stmts.enqueueOrdered
		if notify {
			stmt = c.stmts.enqueueOrderedNotify
		}
		rows, err := tx.QueryContext(ctx, stmt.text, stmt.args(vals)...)
		if err != nil {
			return Enqueued{}, err
		}
		for rows.Next() {
			var group string
			var rowID int64
			if err := rows.Scan(&group, &rowID); err != nil {
				rows.Close()
				return Enqueued{}, err
			}
			if rowID == 0 {
				lost = append(lost, group)
			} else if id == 0 || rowID < id {
				id = rowID
			}
		}
		if err := rowsErr(rows); err != nil {
			rows.Close()
			return Enqueued{}, err
		}
		if err := rows.Close(); err != nil {
			return Enqueued{}, err
		}
	} else {
		// A known event changes nothing: not even a sequence number (its
		// content is inserted first, the keys bumped only when it is new).
		eid, err := c.insertEvent(ctx, tx, vals)
		if err != nil {
			return Enqueued{}, err
		}
		if eid == 0 {
			return c.existing(ctx, tx, ev, hash)
		}
		vals["eid"] = eid
		groups, err := c.queryString(ctx, tx, c.stmts.orderedGroups, vals)
		if err != nil {
			return Enqueued{}, err
		}
		if len(groups) == 0 {
			groups = []string{""}
		}
		for _, g := range groups {
			vals["group"] = g
			seq, unsettled, err := c.bumpKey(ctx, tx, vals)
			if err != nil {
				return Enqueued{}, err
			}
			vals["seq"], vals["status"] = seq, StatusBlocked
			if unsettled == 1 {
				vals["status"] = StatusPending
			}
			rowID, err := c.insertOrdered(ctx, tx, vals)
			if err != nil {
				return Enqueued{}, err
			}
			if rowID == 0 {
				lost = append(lost, g)
			} else if id == 0 || rowID < id {
				id = rowID
			}
		}
	}
	// The event's row already existed in these groups (a transaction that
	// enqueued the same key committed meanwhile): give back the sequence
	// number and the count taken for it. This transaction still holds the
	// key rows, so nothing was taken after them.
	for _, g := range lost {
		vals["group"] = g
		if _, err := tx.ExecContext(ctx, c.stmts.unbumpKey.text, c.stmts.unbumpKey.args(vals)...); err != nil {
			return Enqueued{}, err
		}
	}
	if id > 0 {
		return Enqueued{ID: id, Inserted: true}, nil
	}
	return c.existing(ctx, tx, ev, hash)
}

// bumpKey takes the next sequence number of a key in a group and counts one
// more unsettled event, holding the key row's lock until the transaction
// ends. It returns the sequence number and the new unsettled count.
func (c *Core) bumpKey(ctx context.Context, tx Executor, vals map[string]any) (seq, unsettled int64, err error) {
	q := c.stmts.bumpKey
	if c.dialect == MySQL {
		if _, err := tx.ExecContext(ctx, q.text, q.args(vals)...); err != nil {
			return 0, 0, err
		}
		q = c.stmts.keyState // reads this transaction's own write
	}
	err = c.queryRow(ctx, tx, q, vals, &seq, &unsettled)
	return seq, unsettled, err
}

// insertOrdered inserts one group's row of an ordered event and returns its
// id, or 0 when the row already existed.
func (c *Core) insertOrdered(ctx context.Context, tx Executor, vals map[string]any) (int64, error) {
	return c.insertID(ctx, tx, c.stmts.insertOrdered, vals)
}

var errNoRow = errors.New("no row")

// queryRow scans the first row of q into dest; no row is errNoRow.
func (c *Core) queryRow(ctx context.Context, ex Executor, q query, vals map[string]any, dest ...any) error {
	return queryOne(ctx, ex, q.text, q.args(vals), dest...)
}

// queryOne runs text and scans its first row into dest: errNoRow when it
// returns none.
func queryOne(ctx context.Context, ex Executor, text string, args []any, dest ...any) error {
	rows, err := ex.QueryContext(ctx, text, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rowsErr(rows); err != nil {
			return err
		}
		return errNoRow
	}
	if err := rows.Scan(dest...); err != nil {
		return err
	}
	return rows.Close()
}

// scanSettledRows reads (id, stream, group, ordering key) rows: the ids,
// and the keys of the rows that have one.
func scanSettledRows(rows Rows) (map[int64]bool, []orderKey, error) {
	defer rows.Close()
	ids := map[int64]bool{}
	var keys []orderKey
	for rows.Next() {
		var id int64
		var k orderKey
		if err := rows.Scan(&id, &k.stream, &k.group, &k.key); err != nil {
			return nil, nil, err
		}
		ids[id] = true
		if k.key != "" {
			keys = append(keys, k)
		}
	}
	if err := rowsErr(rows); err != nil {
		return nil, nil, err
	}
	return ids, keys, rows.Close()
}

// ackOrderedRows acknowledges the live receipts of rows with an ordering key
// inside ex, a transaction, and promotes the next event of each key.
// PostgreSQL and SQLite; MySQL's ack does both.
// With hand set, the next events it promotes are handed over (see
// Core.AcknowledgeAndClaimNext) and returned.
func (c *Core) ackOrderedRows(ctx context.Context, ex Executor, rs []Receipt, hand *ClaimRequest) (map[int64]bool, []Claimed, error) {
	q := c.stmts.ackOrdered
	if c.dialect == Postgres {
		// One statement settles the rows and counts them off their keys;
		// a second promotes.
		ids, keys := splitReceipts(rs)
		rows, err := ex.QueryContext(ctx, q.text, q.args(map[string]any{"ids": ids, "keys": keys, "now": c.nowArg()})...)
		if err != nil {
			return nil, nil, err
		}
		done, waiting, err := scanAckedOrdered(rows)
		if err != nil {
			return nil, nil, err
		}
		next, err := c.promoteKeys(ctx, ex, waiting, hand)
		return done, next, err
	}
	text, extra := expandPairs(c.dialect, q.text, rs)
	rows, err := ex.QueryContext(ctx, text, append(q.args(map[string]any{"now": c.nowArg()}), extra...)...)
	if err != nil {
		return nil, nil, err
	}
	done, keys, err := scanSettledRows(rows)
	if err != nil {
		return nil, nil, err
	}
	next, err := c.releaseKeysNext(ctx, ex, keys, hand)
	return done, next, err
}

// handVals adds to vals the parameters of a hand-over for hand.
func (c *Core) handVals(vals map[string]any, hand *ClaimRequest) map[string]any {
	vals["stream"], vals["group"], vals["worker"] = hand.Stream, hand.Group, hand.Worker
	vals["lease"], vals["max"], vals["limit"] = micros(hand.Lease), hand.MaxAttempts, hand.Limit
	// PostgreSQL derives each handed-over row's claim key from this secret,
	// as its claim does (see derivedClaimKey).
	vals["secret"] = newClaimKey()
	return vals
}

// ackNext (PostgreSQL) is ack in one statement that hands the next events
// of the keys it settles over (ackNext, see Core.AcknowledgeAndClaimNext).
func (c *Core) ackNext(ctx context.Context, ex Executor, rs []Receipt, hand *ClaimRequest) (map[int64]bool, []Claimed, error) {
	ids, keys := splitReceipts(inIDOrder(rs))
	q := c.stmts.ackNext
	rows, err := ex.QueryContext(ctx, q.text, q.args(c.handVals(map[string]any{"ids": ids, "keys": keys, "now": c.nowArg()}, hand))...)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	done := map[int64]bool{}
	var next []Claimed
	for rows.Next() {
		var handed bool
		var cl Claimed
		var md, acked string
		var expires, created int64
		if err := rows.Scan(&handed, &cl.ID, &cl.Stream, &cl.Group, &cl.Key, &cl.Kind, &cl.Payload, &md, &cl.Attempts, &cl.ClaimKey, &expires, &created, &cl.OrderingKey, &cl.OrderingSeq, &acked); err != nil {
			return nil, nil, err
		}
		if !handed {
			// The acknowledged ids, comma-separated.
			for s := range strings.SplitSeq(acked, ",") {
				if s == "" {
					continue
				}
				id, err := strconv.ParseInt(s, 10, 64)
				if err != nil {
					return nil, nil, fmt.Errorf("acknowledged ids: %w", err)
				}
				done[id] = true
			}
			continue
		}
		if cl.Metadata, err = decodeMetadata(md); err != nil {
			return nil, nil, err
		}
		cl.LeaseExpiresAt, cl.CreatedAt = fromMicros(expires), fromMicros(created)
		next = append(next, cl)
	}
	if err := rowsErr(rows); err != nil {
		return nil, nil, err
	}
	return done, next, rows.Close()
}

// scanAckedOrdered reads PostgreSQL's ackOrdered: settled ids (id > 0) and
// the keys that still have unsettled events (id 0).
func scanAckedOrdered(rows Rows) (map[int64]bool, []orderKey, error) {
	defer rows.Close()
	ids := map[int64]bool{}
	var waiting []orderKey
	for rows.Next() {
		var id, unsettled int64
		var k orderKey
		if err := rows.Scan(&id, &k.stream, &k.group, &k.key, &unsettled); err != nil {
			return nil, nil, err
		}
		if id > 0 {
			ids[id] = true
		} else {
			waiting = append(waiting, k)
		}
	}
	if err := rowsErr(rows); err != nil {
		return nil, nil, err
	}
	return ids, waiting, rows.Close()
}

// releaseKeys records, inside ex (a transaction), that the head of each key
// settled, and promotes the next blocked event of each key that has one; a
// key listed twice is released twice. The key rows are locked in (stream,
// group, key) order by one statement (one per repetition of a key on MySQL
// and SQLite); the promotion is a later statement, which on PostgreSQL and
// MySQL in READ COMMITTED sees every producer that committed while this
// transaction waited for the key rows.
func (c *Core) releaseKeys(ctx context.Context, ex Executor, keys []orderKey) error {
	_, err := c.releaseKeysNext(ctx, ex, keys, nil)
	return err
}

// releaseKeysNext is releaseKeys handing the next events over for hand
// (see promoteKeys) when it is not nil.
func (c *Core) releaseKeysNext(ctx context.Context, ex Executor, keys []orderKey, hand *ClaimRequest) ([]Claimed, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	keys = slices.Clone(keys)
	slices.SortFunc(keys, compareOrderKeys)
	q := c.stmts.releaseKeys
	if c.dialect == Postgres {
		streams, groups, okeys := splitKeys(keys)
		rows, err := ex.QueryContext(ctx, q.text, q.args(map[string]any{"streams": streams, "groups": groups, "okeys": okeys})...)
		if err != nil {
			return nil, err
		}
		var waiting []orderKey
		for rows.Next() {
			var k orderKey
			if err := rows.Scan(&k.stream, &k.group, &k.key); err != nil {
				rows.Close()
				return nil, err
			}
			waiting = append(waiting, k)
		}
		if err := rowsErr(rows); err != nil {
			rows.Close()
			return nil, err
		}
		if err := rows.Close(); err != nil {
			return nil, err
		}
		return c.promoteKeys(ctx, ex, waiting, hand)
	}
	for _, round := range keyRounds(keys) {
		text, args := expandKeys(c.dialect, q.text, round)
		if _, err := ex.ExecContext(ctx, text, append(q.args(nil), args...)...); err != nil {
			return nil, err
		}
	}
	return c.promoteKeys(ctx, ex, slices.CompactFunc(keys, func(a, b orderKey) bool { return a == b }), hand)
}

// promoteKeys makes pending, inside ex (a transaction), the blocked event
// with the lowest sequence number of each key (sorted, no duplicates) that
// has one and still counts unsettled events. With hand set, those of
// hand's stream and group that are due and have attempts left are claimed
// for hand.Worker instead, at most hand.Limit of them, and returned (see
// Core.AcknowledgeAndClaimNext).
func (c *Core) promoteKeys(ctx context.Context, ex Executor, keys []orderKey, hand *ClaimRequest) ([]Claimed, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	vals := map[string]any{"now": c.nowArg()}
	switch c.dialect {
	case Postgres:
		vals["streams"], vals["groups"], vals["okeys"] = splitKeys(keys)
		if hand != nil {
			return c.promoteNextPG(ctx, ex, c.handVals(vals, hand))
		}
		_, err := ex.ExecContext(ctx, c.stmts.promoteKeys.text, c.stmts.promoteKeys.args(vals)...)
		return nil, err
	case SQLite:
		if hand != nil {
			return c.promoteNextSQLite(ctx, ex, keys, c.handVals(vals, hand))
		}
		text, args := expandKeys(c.dialect, c.stmts.promoteKeys.text, keys)
		_, err := ex.ExecContext(ctx, text, append(c.stmts.promoteKeys.args(vals), args...)...)
		return nil, err
	}
	return c.promoteMySQL(ctx, ex, keys, vals, hand)
}

// promoteNextPG runs promoteNext and reads the events it handed over.
func (c *Core) promoteNextPG(ctx context.Context, ex Executor, vals map[string]any) ([]Claimed, error) {
	q := c.stmts.promoteNext
	rows, err := ex.QueryContext(ctx, q.text, q.args(vals)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var next []Claimed
	for rows.Next() {
		var cl Claimed
		var md string
		var expires, created int64
		if err := rows.Scan(&cl.ID, &cl.Stream, &cl.Group, &cl.Key, &cl.Kind, &cl.Payload, &md, &cl.Attempts, &cl.ClaimKey, &expires, &created, &cl.OrderingKey, &cl.OrderingSeq); err != nil {
			return nil, err
		}
		if cl.Metadata, err = decodeMetadata(md); err != nil {
			return nil, err
		}
		cl.LeaseExpiresAt, cl.CreatedAt = fromMicros(expires), fromMicros(created)
		next = append(next, cl)
	}
	if err := rowsErr(rows); err != nil {
		return nil, err
	}
	return next, rows.Close()
}

// promoteNextSQLite promotes the next blocked event of each key, handing
// over those it can: one read finds them, one statement claims those
// handed over and one makes the others pending (one writer: nothing
// changes in between).
func (c *Core) promoteNextSQLite(ctx context.Context, ex Executor, keys []orderKey, vals map[string]any) ([]Claimed, error) {
	q := c.stmts.nextBlockedDue
	text, args := expandKeys(c.dialect, q.text, keys)
	rows, err := ex.QueryContext(ctx, text, append(q.args(vals), args...)...)
	if err != nil {
		return nil, err
	}
	var handIDs, pendIDs []int64
	for rows.Next() {
		var id int64
		var due bool
		if err := rows.Scan(&id, &due); err != nil {
			rows.Close()
			return nil, err
		}
		if due && len(handIDs) < vals["limit"].(int) {
			handIDs = append(handIDs, id)
		} else {
			pendIDs = append(pendIDs, id)
		}
	}
	if err := rowsErr(rows); err != nil {
		rows.Close()
		return nil, err
	}
	if err := rows.Close(); err != nil {
		return nil, err
	}
	if len(pendIDs) > 0 {
		text, args := expandIDs(c.stmts.promoteIDs.text, pendIDs)
		if _, err := ex.ExecContext(ctx, text, append(c.stmts.promoteIDs.args(vals), args...)...); err != nil {
			return nil, err
		}
	}
	if len(handIDs) == 0 {
		return nil, nil
	}
	q = c.stmts.handOverIDs
	text, args = expandIDs(q.text, handIDs)
	rows, err = ex.QueryContext(ctx, text, append(q.args(vals), args...)...)
	if err != nil {
		return nil, err
	}
	var next []Claimed
	var eventIDs []int64
	for rows.Next() {
		var cl Claimed
		var eid, expires int64
		if err := rows.Scan(&cl.ID, &cl.Stream, &cl.Group, &eid, &cl.Attempts, &cl.ClaimKey, &expires, &cl.OrderingKey, &cl.OrderingSeq); err != nil {
			rows.Close()
			return nil, err
		}
		cl.LeaseExpiresAt = fromMicros(expires)
		next = append(next, cl)
		eventIDs = append(eventIDs, eid)
	}
	if err := rowsErr(rows); err != nil {
		rows.Close()
		return nil, err
	}
	if err := rows.Close(); err != nil {
		return nil, err
	}
	return c.withContent(ctx, ex, next, eventIDs)
}

// promoteMySQL makes pending the next blocked event of each key: a plain
// read finds them, one statement promotes them in id order. With hand set,
// a locking read (in id order) takes them first, and those it can hand
// over are claimed as claimMySQL claims (a key derived from one secret, the
// lease from the database clock).
func (c *Core) promoteMySQL(ctx context.Context, ex Executor, keys []orderKey, vals map[string]any, hand *ClaimRequest) ([]Claimed, error) {
	ids, err := c.nextBlockedMySQL(ctx, ex, keys)
	if err != nil || len(ids) == 0 {
		return nil, err
	}
	slices.Sort(ids)
	var next []Claimed
	var eventIDs []int64
	if hand != nil {
		text, args := expandIDs(c.stmts.lockBlocked.text, ids)
		rows, err := ex.QueryContext(ctx, text, append(c.stmts.lockBlocked.args(nil), args...)...)
		if err != nil {
			return nil, err
		}
		var candidates []Claimed
		var candidateEvents, availableAts []int64
		for rows.Next() {
			var cl Claimed
			var eid, availableAt int64
			if err := rows.Scan(&cl.ID, &cl.Stream, &cl.Group, &eid, &cl.Attempts, &cl.ClaimKey, &availableAt, &cl.OrderingKey, &cl.OrderingSeq); err != nil {
				rows.Close()
				return nil, err
			}
			candidates = append(candidates, cl)
			candidateEvents = append(candidateEvents, eid)
			availableAts = append(availableAts, availableAt)
		}
		if err := rowsErr(rows); err != nil {
			rows.Close()
			return nil, err
		}
		if err := rows.Close(); err != nil {
			return nil, err
		}
		now, err := c.resolveNow(ctx, ex)
		if err != nil {
			return nil, err
		}
		ids = ids[:0]
		for i, cl := range candidates {
			if cl.Stream == hand.Stream && cl.Group == hand.Group && availableAts[i] <= now &&
				cl.Attempts < hand.MaxAttempts && len(next) < hand.Limit {
				next = append(next, cl)
				eventIDs = append(eventIDs, candidateEvents[i])
			} else {
				ids = append(ids, cl.ID)
			}
		}
		if len(next) > 0 {
			expires := now + micros(hand.Lease)
			secret := newClaimKey()
			handIDs := make([]int64, len(next))
			for i := range next {
				next[i].ClaimKey = derivedClaimKey(secret, next[i].ID)
				next[i].Attempts++
				next[i].LeaseExpiresAt = fromMicros(expires)
				handIDs[i] = next[i].ID
			}
			text, idArgs := expandIDs(c.stmts.claimUpdate, handIDs)
			if _, err := ex.ExecContext(ctx, text, append([]any{hand.Worker, expires, secret}, idArgs...)...); err != nil {
				return nil, err
			}
		}
	}
	if len(ids) > 0 {
		text, args := expandIDs(c.stmts.promoteIDs.text, ids)
		if _, err := ex.ExecContext(ctx, text, append(c.stmts.promoteIDs.args(vals), args...)...); err != nil {
			return nil, err
		}
	}
	if len(next) == 0 {
		return nil, nil
	}
	return c.withContent(ctx, ex, next, eventIDs)
}

// callerTxKey marks a context whose statements run in the caller's
// transaction (AcknowledgeInTx), whose isolation the store does not choose.
type callerTxKey struct{}

// inCallerTx is ctx marked as running in the caller's transaction.
func inCallerTx(ctx context.Context) context.Context {
	return context.WithValue(ctx, callerTxKey{}, true)
}

// nextBlockedMySQL reads the next blocked event of each key. In a
// transaction of the store's (READ COMMITTED) one statement reads them
// all, and sees every producer that committed before the key rows were
// locked. In the caller's transaction (REPEATABLE READ by default on
// MySQL) a plain read would see the snapshot of its first read, from
// before a producer that committed since: each key's next event is read
// by a locking read instead (the latest committed rows), one key at a
// time (AcknowledgeInTx settles a few receipts).
func (c *Core) nextBlockedMySQL(ctx context.Context, ex Executor, keys []orderKey) ([]int64, error) {
	if ctx.Value(callerTxKey{}) != nil {
		var ids []int64
		for _, k := range keys {
			got, err := c.queryIDs(ctx, ex, c.stmts.nextBlockedLocked.text, c.stmts.nextBlockedLocked.args(map[string]any{"stream": k.stream, "group": k.group, "okey": k.key}))
			if err != nil {
				return nil, err
			}
			for id := range got {
				ids = append(ids, id)
			}
		}
		return ids, nil
	}
	text, args := expandKeys(c.dialect, c.stmts.nextBlocked.text, keys)
	rows, err := ex.QueryContext(ctx, text, append(c.stmts.nextBlocked.args(nil), args...)...)
	if err != nil {
		return nil, err
	}
	var ids []int64
	for rows.Next() {
		var id sql.NullInt64
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, err
		}
		if id.Valid {
			ids = append(ids, id.Int64)
		}
	}
	if err := rowsErr(rows); err != nil {
		rows.Close()
		return nil, err
	}
	return ids, rows.Close()
}

// keyRounds splits sorted keys into rounds without duplicates: a key listed
// n times is in the first n rounds.
func keyRounds(keys []orderKey) [][]orderKey {
	var rounds [][]orderKey
	for i := 0; i < len(keys); {
		j := i
		for j < len(keys) && keys[j] == keys[i] {
			if len(rounds) <= j-i {
				rounds = append(rounds, nil)
			}
			rounds[j-i] = append(rounds[j-i], keys[j])
			j++
		}
		i = j
	}
	return rounds
}

func splitKeys(keys []orderKey) (streams, groups, okeys []string) {
	streams, groups, okeys = make([]string, len(keys)), make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		streams[i], groups[i], okeys[i] = k.stream, k.group, k.key
	}
	return streams, groups, okeys
}

// failSkip is Fail under DeadLetterSkip: a dead-lettered event with an
// ordering key releases its key in the same transaction, and the next event
// of the key becomes claimable.
func (c *Core) failSkip(ctx context.Context, vals map[string]any) (FailOutcome, error) {
	var status string
	found := false
	err := c.inTxRetry(ctx, "fail under skip", &sql.TxOptions{Isolation: sql.LevelReadCommitted}, func(tx Tx) error {
		found, status = false, ""
		var k orderKey
		if c.dialect == MySQL {
			res, err := tx.ExecContext(ctx, c.stmts.failSkip.text, c.stmts.failSkip.args(vals)...)
			if err != nil {
				return err
			}
			if n, _ := res.RowsAffected(); n != 1 {
				return nil
			}
			err = c.queryRow(ctx, tx, c.stmts.failStatus, vals, &status, &k.stream, &k.group, &k.key)
			if err != nil {
				return err
			}
		} else {
			err := c.queryRow(ctx, tx, c.stmts.failSkip, vals, &status, &k.stream, &k.group, &k.key)
			if errors.Is(err, errNoRow) {
				return nil
			}
			if err != nil {
				return err
			}
		}
		found = true
		if status != StatusDead || k.key == "" {
			return nil
		}
		return c.releaseKeys(ctx, tx, []orderKey{k})
	})
	if err != nil {
		return FailOutcome{}, err
	}
	if !found {
		return FailOutcome{}, ErrStaleClaim // the caller names the event
	}
	return FailOutcome{DeadLettered: status == StatusDead}, nil
}

// settleExhausted dead-letters, under DeadLetterSkip, the claimed events
// with an ordering key whose attempts were already used up (their last
// lease expired): the claim took them once more (attempts above the limit)
// so that this settlement runs in a transaction that also releases their
// key. Should it fail, they stay claimed and the next claim after their
// lease tries again. It returns the other claims.
func (c *Core) settleExhausted(ctx context.Context, req ClaimRequest, out []Claimed) []Claimed {
	if req.DeadLetterPolicy != DeadLetterSkip {
		return out
	}
	kept := out[:0]
	for _, cl := range out {
		if cl.Attempts <= req.MaxAttempts {
			kept = append(kept, cl)
			continue
		}
		_, _ = c.failSkip(ctx, map[string]any{
			"id": cl.ID, "key": cl.ClaimKey, "max": req.MaxAttempts, "delay": int64(0),
			"reason": lastErrorLeaseExpired, "now": c.nowArg(),
		})
	}
	return kept
}

// requeueOrdered requeues the dead letters with an ordering key among ids,
// in one transaction: one that still holds its key (DeadLetterHold) becomes
// pending again, its key's head; one that released it (DeadLetterSkip)
// rejoins its key, pending when no other event of the key is unsettled in
// its group, else blocked and delivered before the key's later events (it
// keeps its sequence number). It returns how many it requeued.
func (c *Core) requeueOrdered(ctx context.Context, stream string, ids []int64) (int, error) {
	n := 0
	err := c.inTxRetry(ctx, "requeue ordered events", &sql.TxOptions{Isolation: sql.LevelReadCommitted}, func(tx Tx) error {
		n = 0
		q := c.stmts.orderedDead
		var text string
		var args []any
		if c.dialect == Postgres {
			text, args = q.text, q.args(map[string]any{"stream": stream, "ids": ids})
		} else {
			var extra []any
			text, extra = expandIDs(q.text, ids)
			args = append(q.args(map[string]any{"stream": stream}), extra...)
		}
		rows, err := tx.QueryContext(ctx, text, args...)
		if err != nil {
			return err
		}
		type dead struct {
			id       int64
			key      orderKey
			released bool
		}
		var rs []dead
		for rows.Next() {
			d := dead{key: orderKey{stream: stream}}
			if err := rows.Scan(&d.id, &d.key.group, &d.key.key, &d.released); err != nil {
				rows.Close()
				return err
			}
			rs = append(rs, d)
		}
		if err := rowsErr(rows); err != nil {
			rows.Close()
			return err
		}
		if err := rows.Close(); err != nil {
			return err
		}
		for _, d := range rs {
			vals := map[string]any{"id": d.id, "stream": stream, "group": d.key.group, "okey": d.key.key, "now": c.nowArg()}
			if !d.released {
				if _, err := tx.ExecContext(ctx, c.stmts.requeueHead.text, c.stmts.requeueHead.args(vals)...); err != nil {
					return err
				}
				n++
				continue
			}
			var unsettled int64
			q := c.stmts.rejoinKey
			if c.dialect == MySQL {
				if _, err := tx.ExecContext(ctx, q.text, q.args(vals)...); err != nil {
					return err
				}
				q = c.stmts.keyUnsettled
			}
			if err := c.queryRow(ctx, tx, q, vals, &unsettled); err != nil {
				return err
			}
			vals["head"] = unsettled == 1
			if _, err := tx.ExecContext(ctx, c.stmts.requeueRejoined.text, c.stmts.requeueRejoined.args(vals)...); err != nil {
				return err
			}
			n++
		}
		return nil
	})
	return n, err
}

// deadOrdering returns the ordering key of a row and whether, dead, it
// still holds that key.
func (c *Core) deadOrdering(ctx context.Context, ex Executor, id int64) (string, bool, error) {
	var okey string
	var released bool
	err := c.queryRow(ctx, ex, c.stmts.deadOrdering, map[string]any{"id": id}, &okey, &released)
	if errors.Is(err, errNoRow) {
		return "", false, nil
	}
	return okey, !released, err
}
