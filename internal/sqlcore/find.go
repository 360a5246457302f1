package sqlcore

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/millpond/millpond/internal/safetext"
)

// EventQuery selects the rows of one event for FindEvents: the row with an
// id, or every row (one per consumer group) of a stream's idempotency key.
type EventQuery struct {
	// ID selects one row by id.
	ID int64
	// Stream and Key select the rows of one event.
	Stream string
	// Key is the event's idempotency key.
	Key string
}

// Validate checks that exactly one of ID and (Stream, Key) is given.
func (q EventQuery) Validate() error {
	switch {
	case q.ID != 0 && (q.Stream != "" || q.Key != ""):
		return fmt.Errorf("an event query takes an id or a stream and key, not both: %w", ErrInvalidID)
	case q.ID < 0:
		return fmt.Errorf("event id %d must be positive: %w", q.ID, ErrInvalidID)
	case q.ID > 0:
		return nil
	}
	if err := ValidateKey("stream", q.Stream); err != nil {
		return err
	}
	return ValidateKey("event key", q.Key)
}

// EventRecord is one stored row of an event, for operators. It carries no
// claim key.
type EventRecord struct {
	// ID is the row id.
	ID int64
	// Stream is the event's stream.
	Stream string
	// Group is the consumer group.
	Group string
	// Key is the idempotency key.
	Key string
	// Kind is the routing kind.
	Kind string
	// Payload is the event body.
	Payload []byte
	// Metadata is the event's metadata.
	Metadata map[string]string
	// Status is the row state.
	Status string
	// Attempts counts the claims made.
	Attempts int
	// ClaimedBy is the worker id of the last claim.
	ClaimedBy string
	// LastError is the last failure text.
	LastError string
	// CreatedAt is when the event was enqueued.
	CreatedAt time.Time
	// AvailableAt is when a pending row is due, or when a processing row's
	// lease expires.
	AvailableAt time.Time
	// DeliveredAt is when a delivered row was acknowledged.
	DeliveredAt time.Time
}

// String describes the record without stream, group, key or payload.
func (r EventRecord) String() string {
	return fmt.Sprintf("EventRecord{ID:%d Stream:%s Group:%s Key:%s Kind:%s Status:%s Attempts:%d PayloadBytes:%d}",
		r.ID, redacted, redacted, redacted, r.Kind, r.Status, r.Attempts, len(r.Payload))
}

// GoString is String, so %#v redacts too.
func (r EventRecord) GoString() string { return r.String() }

// Format writes String for every verb (%q quotes it), so that no verb
// prints the fields one by one.
func (r EventRecord) Format(f fmt.State, verb rune) { safetext.Format(f, verb, r.String()) }

// LogValue redacts the record for log/slog.
func (r EventRecord) LogValue() slog.Value {
	return slog.GroupValue(slog.Int64("id", r.ID), slog.String("stream", redacted), slog.String("group", redacted),
		slog.String("key", redacted), slog.String("kind", r.Kind), slog.String("status", r.Status),
		slog.Int("attempts", r.Attempts), slog.Int("payload_bytes", len(r.Payload)))
}

// MarshalJSON redacts like LogValue.
func (r EventRecord) MarshalJSON() ([]byte, error) {
	return json.Marshal(map[string]any{"id": r.ID, "stream": redacted, "group": redacted, "key": redacted,
		"kind": r.Kind, "status": r.Status, "attempts": r.Attempts, "payload_bytes": len(r.Payload)})
}

const findColumns = `SELECT d.id, d.stream, d.consumer_group, e.event_key, e.event_kind, e.payload, e.metadata, d.status, d.attempts, d.claimed_by, d.last_error,
  e.created_at, d.available_at, d.delivered_at
FROM millpond_deliveries d JOIN millpond_events e ON e.id = d.event_id`

type findStatements struct{ byID, byKey query }

// findQueries are compiled once per dialect, apart from the other
// statements so that this read-only addition stays self-contained.
var findQueries = sync.OnceValue(func() map[Dialect]findStatements {
	m := map[Dialect]findStatements{}
	for _, d := range []Dialect{Postgres, MySQL, SQLite} {
		m[d] = findStatements{
			byID: d.compile(findColumns + "\nWHERE d.id = @id"),
			// One probe of the events' unique index, then the event's rows.
			byKey: d.compile(findColumns + "\nWHERE e.stream = @stream AND e.event_key = @key\nORDER BY d.id LIMIT @limit"),
		}
	}
	return m
})

// FindEvents returns the row with q.ID, or the rows (one per consumer
// group, at most MaxBatch) of q.Stream's event q.Key, by id. Nothing found
// is an empty result, not an error.
func (c *Core) FindEvents(ctx context.Context, q EventQuery) ([]EventRecord, error) {
	if err := q.Validate(); err != nil {
		return nil, err
	}
	st := findQueries()[c.dialect]
	var text string
	var args []any
	if q.ID > 0 {
		text, args = st.byID.text, st.byID.args(map[string]any{"id": q.ID})
	} else {
		text, args = st.byKey.text, st.byKey.args(map[string]any{"stream": q.Stream, "key": q.Key, "limit": MaxBatch})
	}
	rows, err := c.db.QueryContext(ctx, text, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []EventRecord
	for rows.Next() {
		var r EventRecord
		var md string
		var created, available, delivered int64
		if err := rows.Scan(&r.ID, &r.Stream, &r.Group, &r.Key, &r.Kind, &r.Payload, &md, &r.Status, &r.Attempts,
			&r.ClaimedBy, &r.LastError, &created, &available, &delivered); err != nil {
			return nil, err
		}
		if r.Metadata, err = decodeMetadata(md); err != nil {
			return nil, err
		}
		if r.Payload == nil {
			r.Payload = []byte{}
		}
		r.CreatedAt, r.AvailableAt, r.DeliveredAt = fromMicros(created), fromMicros(available), fromMicros(delivered)
		out = append(out, r)
	}
	if err := rowsErr(rows); err != nil {
		return nil, err
	}
	if err := rows.Close(); err != nil {
		return nil, err
	}
	return out, nil
}
