package sqlcore

import (
	"context"
	"fmt"
	"maps"
	"slices"
)

// Since migration 0004 an event's content (key, kind, payload, metadata,
// content hash, creation time) is stored once, in millpond_events, and each
// consumer group's delivery state in a row of millpond_deliveries that
// points at it (event_id). Events are written once and never updated; an
// event is deleted with the last delivery row that points at it, or, with
// WithDeleteOnAck (acknowledgements delete rows), by Purge once it is older
// than the horizon and no delivery row points at it.

// eventContent is the content of one event, as a claim returns it.
type eventContent struct {
	key, kind, metadata string
	payload             []byte
	created             int64
}

// eventsByID reads the content of events by id (MySQL and SQLite claims,
// after the delivery rows are claimed). Events are immutable, and an event
// outlives its delivery rows, so a plain read sees it.
func (c *Core) eventsByID(ctx context.Context, ex Executor, ids []int64) (map[int64]eventContent, error) {
	out := make(map[int64]eventContent, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	text, args := c.withIDs(c.stmts.eventsByID, map[string]any{}, ids)
	rows, err := ex.QueryContext(ctx, text, args...)
	if err != nil {
		return nil, fmt.Errorf("read claimed events: %w", err)
	}
	defer rows.Close()
	// The scan's targets are declared once: each would escape to the heap,
	// every row.
	var id int64
	var ev eventContent
	dest := []any{&id, &ev.key, &ev.kind, &ev.payload, &ev.metadata, &ev.created}
	for rows.Next() {
		ev = eventContent{}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		out[id] = ev
	}
	if err := rowsErr(rows); err != nil {
		return nil, err
	}
	return out, rows.Close()
}

// deleteDeliveries deletes delivery rows by id in tx and, after them (not
// with deleteOnAck), the events no delivery row points at any more; it
// returns how many delivery rows it deleted. The events are locked (in id order) before they are
// checked, so two transactions that delete the last two rows of one event
// check one after the other, and the second (a new statement, in READ
// COMMITTED) sees the first's delete: the event is not left behind.
func (c *Core) deleteDeliveries(ctx context.Context, tx Executor, ids []int64) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	ids = slices.Sorted(slices.Values(ids))
	var events map[int64]bool
	if !c.deleteOnAck { // with it, events outlive their rows until Purge (see WithDeleteOnAck)
		text, args := c.withIDs(c.stmts.eventsOf, map[string]any{}, ids)
		var err error
		if events, err = c.queryIDs(ctx, tx, text, args); err != nil {
			return 0, fmt.Errorf("read events of deleted rows: %w", err)
		}
	}
	text, args := c.withIDs(c.stmts.deleteDeliveries, map[string]any{}, ids)
	res, err := tx.ExecContext(ctx, text, args...)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, err
	}
	eids := slices.Sorted(maps.Keys(events))
	if len(eids) == 0 {
		return n, nil
	}
	if c.stmts.lockEvents.text != "" {
		text, args = c.withIDs(c.stmts.lockEvents, map[string]any{}, eids)
		if _, err := c.queryIDs(ctx, tx, text, args); err != nil {
			return 0, fmt.Errorf("lock events of deleted rows: %w", err)
		}
	}
	text, args = c.withIDs(c.stmts.dropOrphans, map[string]any{}, eids)
	if _, err := tx.ExecContext(ctx, text, args...); err != nil {
		return 0, fmt.Errorf("delete events without rows: %w", err)
	}
	return n, nil
}
