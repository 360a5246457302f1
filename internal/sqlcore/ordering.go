package sqlcore

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"slices"
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
// pending). Outbox rows are locked before key rows everywhere but in
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
		// A known event changes nothing: not even a sequence number.
		found, err := c.lookup(ctx, tx, c.stmts.existing, ev, hash)
		if err != nil || found.ID > 0 {
			return found, err
		}
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
	q := c.stmts.insertOrdered
	if c.dialect == MySQL {
		res, err := tx.ExecContext(ctx, q.text, q.args(vals)...)
		if err != nil {
			return 0, err
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return 0, nil
		}
		id, ok := lastInsertID(res)
		if !ok {
			return 0, errors.New("insert reported no id")
		}
		return id, nil
	}
	var id int64
	err := c.queryRow(ctx, tx, q, vals, &id)
	if errors.Is(err, errNoRow) {
		return 0, nil
	}
	return id, err
}

var errNoRow = errors.New("no row")

// queryRow scans the first row of q into dest; no row is errNoRow.
func (c *Core) queryRow(ctx context.Context, ex Executor, q query, vals map[string]any, dest ...any) error {
	rows, err := ex.QueryContext(ctx, q.text, q.args(vals)...)
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
func (c *Core) ackOrderedRows(ctx context.Context, ex Executor, rs []Receipt) (map[int64]bool, error) {
	q := c.stmts.ackOrdered
	var text string
	var args []any
	if c.dialect == Postgres {
		ids, keys := splitReceipts(rs)
		text, args = q.text, q.args(map[string]any{"ids": ids, "keys": keys, "now": c.nowArg()})
	} else {
		var extra []any
		text, extra = expandPairs(c.dialect, q.text, rs)
		args = append(q.args(map[string]any{"now": c.nowArg()}), extra...)
	}
	rows, err := ex.QueryContext(ctx, text, args...)
	if err != nil {
		return nil, err
	}
	done, keys, err := scanSettledRows(rows)
	if err != nil {
		return nil, err
	}
	return done, c.releaseKeys(ctx, ex, keys)
}

// releaseKeys records, inside ex (a transaction), that the head of each key
// settled, and promotes the next blocked event of each key that has one.
// Keys are locked in order; a key listed twice is released twice.
func (c *Core) releaseKeys(ctx context.Context, ex Executor, keys []orderKey) error {
	keys = slices.Clone(keys)
	slices.SortFunc(keys, compareOrderKeys)
	for _, k := range keys {
		vals := map[string]any{"stream": k.stream, "group": k.group, "okey": k.key, "now": c.nowArg()}
		var unsettled int64
		q := c.stmts.releaseKey
		if c.dialect == MySQL {
			if _, err := ex.ExecContext(ctx, q.text, q.args(vals)...); err != nil {
				return err
			}
			q = c.stmts.keyUnsettled
		}
		if err := c.queryRow(ctx, ex, q, vals, &unsettled); err != nil {
			if errors.Is(err, errNoRow) {
				continue // no state: nothing waits behind this event
			}
			return err
		}
		if unsettled <= 0 {
			continue
		}
		// A new statement: on PostgreSQL in READ COMMITTED it sees every
		// producer that committed while this transaction waited for the
		// key row. On MySQL an UPDATE reads the latest rows in any
		// isolation level.
		if _, err := ex.ExecContext(ctx, c.stmts.promote.text, c.stmts.promote.args(vals)...); err != nil {
			return err
		}
	}
	return nil
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
