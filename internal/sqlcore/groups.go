package sqlcore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"
)

// lifecycleChunk is how many rows one transaction of DiscardDead,
// RetireGroup or ReroutePending locks and changes at most, so a large group
// never holds one long transaction.
const lifecycleChunk = MaxBatch

// Subscription is one group's registration on a stream.
type Subscription struct {
	// Stream is the stream.
	Stream string
	// Group is the consumer group.
	Group string
	// Kinds are the registered kinds, sorted; "" stands for every kind.
	Kinds []string
	// RegisteredAt is when the group's oldest registration row was written.
	RegisteredAt time.Time
}

// GroupActivity counts the rows of one stream and group, in every state.
type GroupActivity struct {
	// Stream is the stream.
	Stream string
	// Group is the consumer group ("" is the default group).
	Group string
	// Pending, Processing, Dead and Delivered count rows by state (Pending
	// includes the rows blocked behind their ordering key's head); delivered
	// rows are counted until Purge removes them.
	Pending, Processing, Dead, Delivered int64
	// LastEnqueuedAt is the created_at of the group's newest row.
	LastEnqueuedAt time.Time
	// LastDeliveredAt is the newest delivered_at among rows not yet purged;
	// zero when there is none.
	LastDeliveredAt time.Time
}

// Subscriptions lists every group registration, by stream and group.
func (c *Core) Subscriptions(ctx context.Context) ([]Subscription, error) {
	st := c.stmts.lifecycle.subscriptions
	rows, err := c.db.QueryContext(ctx, st.text, st.args(nil)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Subscription
	for rows.Next() {
		var stream, group, kind string
		var created int64
		if err := rows.Scan(&stream, &group, &kind, &created); err != nil {
			return nil, err
		}
		at := fromMicros(created)
		if n := len(out); n > 0 && out[n-1].Stream == stream && out[n-1].Group == group {
			last := &out[n-1]
			last.Kinds = append(last.Kinds, kind)
			if at.Before(last.RegisteredAt) {
				last.RegisteredAt = at
			}
			continue
		}
		out = append(out, Subscription{Stream: stream, Group: group, Kinds: []string{kind}, RegisteredAt: at})
	}
	if err := rowsErr(rows); err != nil {
		return nil, err
	}
	return out, rows.Close()
}

// Activity counts the rows of every stream and group that has any, in every
// state. It reads the whole outbox table: an operator's query, not one for
// a hot path.
func (c *Core) Activity(ctx context.Context) ([]GroupActivity, error) {
	st := c.stmts.lifecycle.activity
	rows, err := c.db.QueryContext(ctx, st.text, st.args(nil)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []GroupActivity
	for rows.Next() {
		var a GroupActivity
		var created, delivered int64
		if err := rows.Scan(&a.Stream, &a.Group, &a.Pending, &a.Processing, &a.Dead, &a.Delivered, &created, &delivered); err != nil {
			return nil, err
		}
		a.LastEnqueuedAt, a.LastDeliveredAt = fromMicros(created), fromMicros(delivered)
		out = append(out, a)
	}
	if err := rowsErr(rows); err != nil {
		return nil, err
	}
	return out, rows.Close()
}

// SchemaVersion returns the highest migration recorded in the database, or
// 0 when the outbox schema is not installed (no migrations table, or no
// migration recorded in it).
func (c *Core) SchemaVersion(ctx context.Context) (int, error) {
	ls := c.stmts.lifecycle
	exists, err := c.queryInt(ctx, c.db, ls.schemaTable, nil)
	if err != nil || exists == 0 {
		return 0, err
	}
	v, err := c.queryInt(ctx, c.db, ls.schemaVersion, nil)
	return int(v), err
}

// queryInt runs a query that returns one integer.
func (c *Core) queryInt(ctx context.Context, ex Executor, q query, vals map[string]any) (int64, error) {
	rows, err := ex.QueryContext(ctx, q.text, q.args(vals)...)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rowsErr(rows); err != nil {
			return 0, err
		}
		return 0, errors.New("query returned no row")
	}
	var n int64
	if err := rows.Scan(&n); err != nil {
		return 0, err
	}
	return n, rows.Close()
}

// DeadSelector names dead-lettered events of one stream to discard: by id,
// or the dead letters of one group, of one kind or all of them. Exactly one
// of IDs, Kind and All must be given.
type DeadSelector struct {
	// Stream is the events' stream (required).
	Stream string
	// IDs selects dead letters of the stream by id (1-MaxBatch ids, in any
	// group: ids are unique across groups). Group must then be empty.
	IDs []int64
	// Group is the consumer group whose dead letters Kind or All select;
	// "" is the default group.
	Group string
	// Kind selects the group's dead letters of this event kind.
	Kind string
	// All selects every dead letter of the group.
	All bool
}

// Validate checks the selector.
func (s DeadSelector) Validate() error {
	if err := ValidateKey("stream", s.Stream); err != nil {
		return err
	}
	given := 0
	for _, b := range []bool{len(s.IDs) > 0, s.Kind != "", s.All} {
		if b {
			given++
		}
	}
	if given != 1 {
		return fmt.Errorf("name exactly one of ids, a kind, or all of a group (got %d): %w", given, ErrInvalidSelector)
	}
	if len(s.IDs) > 0 {
		if s.Group != "" {
			return fmt.Errorf("ids select events of every group; a group applies only to a kind or all: %w", ErrInvalidSelector)
		}
		return validateIDs(s.IDs)
	}
	if err := ValidateGroup(s.Group); err != nil {
		return err
	}
	if s.Kind != "" {
		return ValidateKey("event kind", s.Kind)
	}
	return nil
}

// DiscardDead deletes the dead-lettered events sel names and returns how
// many it deleted. Events that are not (or no longer) dead letters of the
// stream are left alone. Deleted events leave the idempotency window like
// purged ones.
func (c *Core) DiscardDead(ctx context.Context, sel DeadSelector) (int64, error) {
	if err := sel.Validate(); err != nil {
		return 0, err
	}
	ls := c.stmts.lifecycle
	if len(sel.IDs) > 0 {
		gone, err := c.deleteChunk(ctx, ls.lockDead, sel.Stream, sel.IDs)
		return int64(len(gone)), err
	}
	var total int64
	err := c.eachChunk(ctx, ls.deadOfGroup, map[string]any{
		"stream": sel.Stream, "group": sel.Group, "any_kind": sel.Kind == "", "kind": sel.Kind,
	}, func(ids []int64) error {
		gone, err := c.deleteChunk(ctx, ls.lockDead, sel.Stream, ids)
		total += int64(len(gone))
		return err
	})
	return total, err
}

// CountDead counts the dead-lettered events sel names by Kind or All, as
// DiscardDead would find them now, with plain reads that lock nothing.
func (c *Core) CountDead(ctx context.Context, sel DeadSelector) (int64, error) {
	if err := sel.Validate(); err != nil {
		return 0, err
	}
	if len(sel.IDs) > 0 {
		return 0, fmt.Errorf("count dead letters by kind or all of a group, not by id: %w", ErrInvalidSelector)
	}
	var total int64
	err := c.eachChunk(ctx, c.stmts.lifecycle.deadOfGroup, map[string]any{
		"stream": sel.Stream, "group": sel.Group, "any_kind": sel.Kind == "", "kind": sel.Kind,
	}, func(ids []int64) error {
		total += int64(len(ids))
		return nil
	})
	return total, err
}

// eachChunk reads the ids a candidate query selects, lifecycleChunk at a
// time in id order, and hands each chunk to fn.
func (c *Core) eachChunk(ctx context.Context, candidates query, vals map[string]any, fn func([]int64) error) error {
	vals["limit"] = lifecycleChunk
	var after int64
	for {
		vals["after"] = after
		found, err := c.queryIDs(ctx, c.db, candidates.text, candidates.args(vals))
		if err != nil {
			return err
		}
		if len(found) == 0 {
			return nil
		}
		ids := sortedIDs(found)
		if err := fn(ids); err != nil {
			return err
		}
		after = ids[len(ids)-1]
	}
}

func sortedIDs(set map[int64]bool) []int64 {
	ids := make([]int64, 0, len(set))
	for id := range set {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// lockedRow is a row a locking read took: its id, state, kind, group and
// ordering key, and whether its key was let go already.
type lockedRow struct {
	id          int64
	status      string
	kind        string
	group       string
	orderingKey string
	keyReleased bool
}

// lockRows runs a lock statement over ids (sorted and without repeats, so
// the locks are taken in id order) and returns the rows still in the state
// it checks.
func (c *Core) lockRows(ctx context.Context, tx Tx, lock query, stream string, ids []int64) ([]lockedRow, error) {
	ids = slices.Clone(ids)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	text, args := c.withIDs(lock, map[string]any{"stream": stream}, ids)
	rows, err := tx.QueryContext(ctx, text, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []lockedRow
	for rows.Next() {
		var r lockedRow
		if err := rows.Scan(&r.id, &r.status, &r.kind, &r.group, &r.orderingKey, &r.keyReleased); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	if err := rowsErr(rows); err != nil {
		return nil, err
	}
	return out, rows.Close()
}

// withIDs binds a statement that takes a list of ids: an array parameter on
// PostgreSQL, a JSON array on MySQL where the statement takes @ids (see
// jsonIDs), an expanded {ids} list elsewhere.
func (c *Core) withIDs(q query, vals map[string]any, ids []int64) (string, []any) {
	if c.dialect == Postgres {
		vals["ids"] = ids
		return q.text, q.args(vals)
	}
	if slices.Contains(q.names, "ids") {
		vals["ids"] = jsonIDs(ids)
		return q.text, q.args(vals)
	}
	text, extra := expandIDs(q.text, ids)
	return text, append(q.args(vals), extra...)
}

// lifecycleTx runs fn in a transaction that may be run again after a
// deadlock; on MySQL in READ COMMITTED, so that its plain reads see
// committed rows and its locking reads lock only the rows they return.
func (c *Core) lifecycleTx(ctx context.Context, fn func(Tx) error) error {
	var opts *sql.TxOptions
	if c.dialect == MySQL {
		opts = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}
	return c.inTxRetry(ctx, "group lifecycle", opts, fn)
}

// deleteChunk locks, in id order, the rows among ids that lock still
// selects, deletes them in the same transaction and returns them. A deleted
// dead letter that held its ordering key lets the key go in the same
// transaction, so the key's next event becomes claimable.
func (c *Core) deleteChunk(ctx context.Context, lock query, stream string, ids []int64) ([]lockedRow, error) {
	var gone []lockedRow
	err := c.lifecycleTx(ctx, func(tx Tx) error {
		var err error
		if gone, err = c.lockRows(ctx, tx, lock, stream, ids); err != nil || len(gone) == 0 {
			return err
		}
		del := make([]int64, len(gone))
		for i, r := range gone {
			del[i] = r.id
		}
		if _, err = c.deleteDeliveries(ctx, tx, del); err != nil {
			return err
		}
		var held []orderKey
		for _, r := range gone {
			if r.status == StatusDead && r.orderingKey != "" && !r.keyReleased {
				held = append(held, orderKey{stream: stream, group: r.group, key: r.orderingKey})
			}
		}
		return c.releaseKeys(ctx, tx, held)
	})
	if err != nil {
		return nil, err
	}
	return gone, nil
}

// count adds deleted rows to the counts by their state.
func (r *Retired) count(gone []lockedRow) {
	for _, g := range gone {
		switch g.status {
		case StatusPending, StatusBlocked:
			r.Pending++
		case StatusProcessing:
			r.Processing++
		default:
			r.Dead++
		}
	}
}

// RetireRequest asks to unregister a consumer group from a stream.
type RetireRequest struct {
	// Stream is the stream (required).
	Stream string
	// Group is the consumer group (required; the default group "" is not a
	// registration and cannot be retired).
	Group string
	// Discard deletes the group's undelivered events (pending, processing
	// and dead-lettered) instead of refusing while some are pending or
	// processing.
	Discard bool
}

// Validate checks the request.
func (r RetireRequest) Validate() error {
	if err := ValidateKey("stream", r.Stream); err != nil {
		return err
	}
	return ValidateKey("consumer group", r.Group)
}

// Retired reports what RetireGroup did or, when it refused, what it found.
type Retired struct {
	// Unregistered is true when the group's registration was removed.
	Unregistered bool
	// Pending, Processing and Dead count the group's undelivered events: the
	// ones deleted with Discard, otherwise the ones found (dead letters stay
	// with the group when it is retired without Discard).
	Pending, Processing, Dead int64
}

// RetireGroup unregisters a consumer group from a stream so that no event
// is written for it any more. Without Discard it refuses, changing nothing,
// while the group has pending or processing events (ErrGroupNotDrained);
// its dead letters stay listable. With Discard it also deletes every
// undelivered event of the group, in chunks after the registration is gone.
// A group that is neither registered nor holds undelivered events to
// discard is ErrGroupNotRegistered. Delivered rows stay until Purge: they
// keep the events' keys in the idempotency window.
func (c *Core) RetireGroup(ctx context.Context, r RetireRequest) (Retired, error) {
	if err := r.Validate(); err != nil {
		return Retired{}, err
	}
	ls := c.stmts.lifecycle
	vals := map[string]any{"stream": r.Stream, "group": r.Group}
	var res Retired
	err := c.lifecycleTx(ctx, func(tx Tx) error {
		res = Retired{}
		st := c.stmts.unregister
		out, err := tx.ExecContext(ctx, st.text, st.args(vals)...)
		if err != nil {
			return err
		}
		n, err := out.RowsAffected()
		if err != nil {
			return err
		}
		res.Unregistered = n > 0
		rows, err := tx.QueryContext(ctx, ls.groupCounts.text, ls.groupCounts.args(vals)...)
		if err != nil {
			return err
		}
		defer rows.Close()
		if rows.Next() {
			if err := rows.Scan(&res.Pending, &res.Processing, &res.Dead); err != nil {
				return err
			}
		}
		if err := rowsErr(rows); err != nil {
			return err
		}
		if err := rows.Close(); err != nil {
			return err
		}
		switch {
		case !r.Discard && res.Pending+res.Processing > 0:
			return fmt.Errorf("%d pending and %d processing events: %w", res.Pending, res.Processing, ErrGroupNotDrained)
		case !res.Unregistered && (!r.Discard || res.Pending+res.Processing+res.Dead == 0):
			return ErrGroupNotRegistered
		}
		return nil
	})
	if err != nil {
		if !errors.Is(err, ErrGroupNotDrained) {
			res = Retired{}
		}
		res.Unregistered = false
		return res, err
	}
	if !r.Discard {
		return res, nil
	}
	// The registration is gone: delete what is left (an enqueue that read
	// it before may still add rows, see below).
	res.Pending, res.Processing, res.Dead = 0, 0, 0
	for _, candidates := range []query{ls.unsettledOfGroup, ls.deadOfGroup} {
		err := c.eachChunk(ctx, candidates, map[string]any{"stream": r.Stream, "group": r.Group, "any_kind": true, "kind": ""}, func(ids []int64) error {
			gone, err := c.deleteChunk(ctx, ls.lockUndelivered, r.Stream, ids)
			res.count(gone)
			return err
		})
		if err != nil {
			return res, fmt.Errorf("unregistered, then discarding its events: %w", err)
		}
	}
	// Its events are gone; then the states of its ordering keys. A producer
	// that read the registration before it was removed may still be
	// committing an event of the group behind a head discarded above (it
	// holds its key's row): the key rows are locked first, which waits for
	// such producers, then a new read finds what they committed, which is
	// discarded too, and the states go. (Deleting the states under it would
	// leave such an event blocked for good, with no head before it.)
	err = c.lifecycleTx(ctx, func(tx Tx) error {
		if _, err := c.queryString(ctx, tx, ls.lockKeys, vals); err != nil {
			return err
		}
		late, err := c.queryIDs(ctx, tx, ls.lateOrdered.text, ls.lateOrdered.args(vals))
		if err != nil {
			return err
		}
		if len(late) > 0 {
			gone, err := c.lockRows(ctx, tx, ls.lockUndelivered, r.Stream, slices.Collect(maps.Keys(late)))
			if err != nil {
				return err
			}
			res.count(gone)
			del := make([]int64, len(gone))
			for i, g := range gone {
				del[i] = g.id
			}
			if _, err := c.deleteDeliveries(ctx, tx, del); err != nil {
				return err
			}
		}
		_, err = tx.ExecContext(ctx, ls.forgetKeys.text, ls.forgetKeys.args(vals)...)
		return err
	})
	if err != nil {
		return res, fmt.Errorf("unregistered and discarded its events, then forgetting its ordering keys: %w", err)
	}
	return res, nil
}

// ReroutePending moves the pending events of the stream's default group ("",
// where events wait that no group took when they were enqueued) to the
// groups that take their kind now (the groups Reroute would choose), keeping
// each event's due time, with fresh attempts. Events whose kind no group
// takes stay where they are, as do claimed ones. It returns how many events
// it moved.
func (c *Core) ReroutePending(ctx context.Context, stream string) (int64, error) {
	if err := ValidateKey("stream", stream); err != nil {
		return 0, err
	}
	ls := c.stmts.lifecycle
	var moved int64
	err := c.eachChunk(ctx, ls.pendingDefault, map[string]any{"stream": stream}, func(ids []int64) error {
		var n int64
		err := c.lifecycleTx(ctx, func(tx Tx) error {
			n = 0
			locked, err := c.lockRows(ctx, tx, ls.lockPending, stream, ids)
			if err != nil || len(locked) == 0 {
				return err
			}
			takers := map[string][]string{} // kind -> groups
			byGroup := map[string][]int64{}
			var gone []int64
			for _, r := range locked {
				groups, ok := takers[r.kind]
				if !ok {
					if groups, err = c.queryString(ctx, tx, c.stmts.kindGroups, map[string]any{"stream": stream, "kind": r.kind}); err != nil {
						return err
					}
					takers[r.kind] = groups
				}
				if len(groups) == 0 {
					continue // no group takes it any more: it stays
				}
				for _, g := range groups {
					byGroup[g] = append(byGroup[g], r.id)
				}
				gone = append(gone, r.id)
			}
			if len(gone) == 0 {
				return nil
			}
			for _, g := range slices.Sorted(maps.Keys(byGroup)) {
				text, args := c.withIDs(ls.copyPending, map[string]any{"group": g}, byGroup[g])
				if _, err := tx.ExecContext(ctx, text, args...); err != nil {
					return err
				}
			}
			if _, err := c.deleteDeliveries(ctx, tx, gone); err != nil {
				return err
			}
			n = int64(len(gone))
			return nil
		})
		moved += n
		return err
	})
	return moved, err
}
