package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/millpond/millpond/internal/safetext"
	"github.com/millpond/millpond/internal/sqlcore"
)

// EventQuery selects the stored rows of one event for Store.FindEvents:
// either the row with ID, or every row of the event with Key in Stream
// (one per consumer group that received it). Give ID alone, or Stream and
// Key; anything else is refused (ErrInvalidID or ErrInvalidKey). String,
// GoString, Format, LogValue and MarshalJSON hide its stream and key.
type EventQuery struct {
	// ID selects one row by its id (as listed by ListDead or shown by
	// the admin UI).
	ID int64
	// Stream is the event's stream, with Key.
	Stream string
	// Key is the event's idempotency key, with Stream.
	Key string
}

// Validate checks that the query names an id or a stream and key.
func (q EventQuery) Validate() error { return sqlcore.EventQuery(q).Validate() }

// String describes the query without its stream or key.
func (q EventQuery) String() string {
	return fmt.Sprintf("EventQuery{ID:%d Stream:%s Key:%s}", q.ID, redactIfSet(q.Stream), redactIfSet(q.Key))
}

// GoString is String, so %#v redacts too.
func (q EventQuery) GoString() string { return q.String() }

// Format writes String for every verb (%q quotes it).
func (q EventQuery) Format(f fmt.State, verb rune) { safetext.Format(f, verb, q.String()) }

// LogValue redacts the query for log/slog.
func (q EventQuery) LogValue() slog.Value {
	return slog.GroupValue(slog.Int64("id", q.ID), slog.String("stream", redactIfSet(q.Stream)), slog.String("key", redactIfSet(q.Key)))
}

// MarshalJSON redacts like LogValue.
func (q EventQuery) MarshalJSON() ([]byte, error) {
	return json.Marshal(map[string]any{"id": q.ID, "stream": redactIfSet(q.Stream), "key": redactIfSet(q.Key)})
}

func redactIfSet(s string) string {
	if s == "" {
		return ""
	}
	return "[REDACTED]"
}

// EventRecord is one stored row of an event (one consumer group's
// delivery), as Store.FindEvents returns it for operators. It never carries
// the claim key. String, GoString, LogValue and MarshalJSON hide its
// stream, group, key and payload.
type EventRecord struct {
	// ID is the row id.
	ID int64
	// Stream is the event's stream.
	Stream string
	// Group is the consumer group of this delivery ("" is the default
	// group).
	Group string
	// Key is the event's idempotency key.
	Key string
	// Kind is the event's kind.
	Kind string
	// Payload is the event's body.
	Payload []byte
	// Metadata is the event's metadata.
	Metadata map[string]string
	// Status is StatusPending, StatusProcessing, StatusDelivered or
	// StatusDead.
	Status string
	// Attempts counts the claims of this delivery.
	Attempts int
	// ClaimedBy is the worker id of the last claim, "" if never claimed.
	ClaimedBy string
	// LastError is the last failure's reason, "" if none.
	LastError string
	// CreatedAt is when the event was enqueued, by the database's clock.
	CreatedAt time.Time
	// AvailableAt is when a pending row is due, or when a processing
	// row's lease expires; for settled rows it is the last of these.
	AvailableAt time.Time
	// DeliveredAt is when a delivered row was acknowledged; zero otherwise.
	DeliveredAt time.Time
}

// String describes the record without its stream, group, key or payload.
func (r EventRecord) String() string { return sqlcore.EventRecord(r).String() }

// GoString is String, so %#v redacts too.
func (r EventRecord) GoString() string { return sqlcore.EventRecord(r).GoString() }

// Format writes String for every verb (%q quotes it), so that no verb
// (%d, %x, %s of the struct's fields) prints a secret.
func (r EventRecord) Format(f fmt.State, verb rune) { sqlcore.EventRecord(r).Format(f, verb) }

// LogValue redacts the record for log/slog.
func (r EventRecord) LogValue() slog.Value { return sqlcore.EventRecord(r).LogValue() }

// MarshalJSON redacts like LogValue.
func (r EventRecord) MarshalJSON() ([]byte, error) { return sqlcore.EventRecord(r).MarshalJSON() }

// FindEvents looks an event up for operators: the row with q.ID, or the
// rows of q.Stream's event q.Key, one per consumer group, by id. Both are
// index lookups. Nothing found is an empty result, not an error. It reads
// any state (pending, processing, delivered until purged, dead-lettered).
func (s *Store) FindEvents(ctx context.Context, q EventQuery) ([]EventRecord, error) {
	if err := s.ready(ctx); err != nil {
		return nil, err
	}
	out, err := s.core.FindEvents(ctx, sqlcore.EventQuery(q))
	if err != nil {
		return nil, fmt.Errorf("outbox: find events: %w", err)
	}
	return convert(out, recordFromCore), nil
}

func recordFromCore(r sqlcore.EventRecord) EventRecord { return EventRecord(r) }
