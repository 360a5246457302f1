// Package handlers defines typed event handlers for the millpond bus.
//
// A Handler subscribes to one event kind of one stream. Its name is its
// consumer group, so several handlers of one kind each get every event and
// keep their own delivery state and retry policy. New builds a Handler from
// a function of a typed event: the JSON payload is decoded into the type, a
// payload that does not decode is dead-lettered at once (no retry can fix
// it), an error is retried under the handler's policy, and a panic is turned
// into an error, so the event is nacked rather than lost.
package handlers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millpond/millpond/internal/gostack"
	"github.com/millpond/millpond/internal/panicstack"
	"github.com/millpond/millpond/internal/safetext"
	"github.com/millpond/millpond/outbox"
)

// Handler is one subscription of the bus.
type Handler interface {
	// Name is unique within the bus and is the handler's consumer group.
	Name() string
	// Stream is the stream (Watermill topic) the handler reads.
	Stream() string
	// Kind is the event kind the handler handles.
	Kind() string
	// Policy is the handler's retry policy.
	Policy() Policy
	// Handle processes one message; an error nacks it.
	Handle(msg *message.Message) error
}

// Policy is a handler's delivery and retry policy. Zero fields take the
// bus defaults.
type Policy struct {
	// MaxAttempts dead-letters an event after this many deliveries.
	MaxAttempts int
	// Backoff gives the delay before the next attempt after the given
	// failed attempt (1 for the first).
	Backoff func(attempt int) time.Duration
	// Lease is how long a delivery is held before it may be retried
	// elsewhere; it is extended while the handler runs.
	Lease time.Duration
	// MaxInFlight is how many events of this handler run at once. Events
	// with an ordering key are still handed out one at a time per key.
	MaxInFlight int
	// DeadLetterPolicy is what a dead-lettered event with an ordering key
	// does to the later events of its key for this handler: hold them until
	// it is requeued, or skip it; the zero value, DeadLetterDefault, takes
	// the bus's (hold unless its Config.Subscriber says skip).
	DeadLetterPolicy DeadLetterPolicy
	// HoldClaims makes this handler's subscriber hold its claims
	// (outbox.SubscriberConfig.HoldClaims, PostgreSQL and MySQL) whatever the
	// bus's default is. Meta.AcknowledgeInTx then fails for its held
	// deliveries.
	HoldClaims bool
}

// DeadLetterPolicy says what a dead-lettered event with an ordering key
// does to the later events of its key (see outbox.DeadLetterPolicy).
type DeadLetterPolicy int

const (
	// DeadLetterDefault (the zero value) takes the bus's policy.
	DeadLetterDefault DeadLetterPolicy = iota
	// DeadLetterHold keeps the key's later events waiting until the dead
	// letter is requeued; it is then handled first. It is the bus's
	// default, and a handler that asks for it holds whatever the bus's.
	DeadLetterHold
	// DeadLetterSkip hands out the key's next event as soon as its
	// predecessor is dead-lettered.
	DeadLetterSkip
)

// Meta describes the delivery of an event to a handler. String, GoString,
// Format, LogValue and MarshalJSON hide its key, ordering key and metadata
// values, so that a handler that logs its Meta logs none of them.
type Meta struct {
	// Key is the event's idempotency key (the Watermill message UUID).
	Key string
	// Kind is the event kind.
	Kind string
	// Attempt is the delivery attempt, 1 for the first.
	Attempt int
	// EventID is the outbox row id of this delivery.
	EventID int64
	// Metadata is the message metadata (trace context, correlation id...).
	Metadata message.Metadata
	// OrderingKey is the event's ordering key, "" when it is unordered.
	// Events of one key reach the handler one at a time, in the order
	// their transactions committed.
	OrderingKey string
	// OrderingSeq is the event's position in its key's sequence (1 for the
	// first), 0 when it is unordered.
	OrderingSeq int64

	msg *message.Message // the delivery, for AcknowledgeInTx
}

// redacted stands for a secret in Meta's descriptions.
const redacted = "[REDACTED]"

func redactIfSet(s string) string {
	if s == "" {
		return ""
	}
	return redacted
}

// String describes the delivery without its key, ordering key or metadata
// values (the metadata's keys are listed).
func (m Meta) String() string {
	return fmt.Sprintf("Meta{Key:%s Kind:%s Attempt:%d EventID:%d MetadataKeys:%v OrderingKey:%s OrderingSeq:%d}",
		redacted, m.Kind, m.Attempt, m.EventID, slices.Sorted(maps.Keys(m.Metadata)), redactIfSet(m.OrderingKey), m.OrderingSeq)
}

// GoString is String, so %#v redacts too.
func (m Meta) GoString() string { return m.String() }

// Format writes String for every verb (%q quotes it), so that no verb
// prints the fields one by one.
func (m Meta) Format(f fmt.State, verb rune) { safetext.Format(f, verb, m.String()) }

// LogValue redacts the delivery for log/slog.
func (m Meta) LogValue() slog.Value {
	return slog.GroupValue(slog.String("key", redacted), slog.String("kind", m.Kind), slog.Int("attempt", m.Attempt),
		slog.Int64("event_id", m.EventID), slog.Any("metadata_keys", slices.Sorted(maps.Keys(m.Metadata))),
		slog.String("ordering_key", redactIfSet(m.OrderingKey)), slog.Int64("ordering_seq", m.OrderingSeq))
}

// MarshalJSON redacts like LogValue.
func (m Meta) MarshalJSON() ([]byte, error) {
	return json.Marshal(map[string]any{"key": redacted, "kind": m.Kind, "attempt": m.Attempt, "event_id": m.EventID,
		"metadata_keys": slices.Sorted(maps.Keys(m.Metadata)), "ordering_key": redactIfSet(m.OrderingKey), "ordering_seq": m.OrderingSeq})
}

// AcknowledgeInTx acknowledges this delivery inside the handler's own open
// transaction tx (outbox.SQLTx or outbox.PgxTx on the outbox's database),
// so that the handler's writes and the acknowledgement commit together or
// not at all: exactly-once effects. Call it last, just before committing
// tx, then commit and return nil; the bus then writes no acknowledgement of
// its own and reports no lost lease. If tx rolls back, return the error:
// the event is retried. It returns outbox.ErrStaleClaim when the delivery's
// lease was lost, and outbox.ErrNoReceipt for a Meta that did not come from
// an outbox delivery or came from a held claim (WithHoldClaims, or the
// bus's Subscriber.HoldClaims).
func (m Meta) AcknowledgeInTx(ctx context.Context, tx outbox.Tx) error {
	if m.msg == nil {
		return fmt.Errorf("handlers: acknowledge in a transaction: %w", outbox.ErrNoReceipt)
	}
	return outbox.AcknowledgeMessageInTx(ctx, tx, m.msg)
}

// Metadata keys the outbox Subscriber sets on each message; they match the
// outbox package's constants.
const (
	metadataKind     = "event_kind"
	metadataAttempt  = "millpond_attempt"
	metadataEventID  = "millpond_event_id"
	metadataOrderKey = "millpond_ordering_key"
	metadataOrderSeq = "millpond_ordering_seq"
)

// MetaOf reads the delivery description of a message.
func MetaOf(msg *message.Message) Meta {
	md := msg.Metadata
	return Meta{Key: msg.UUID, Kind: md[metadataKind], Attempt: int(parseInt(md[metadataAttempt])), EventID: parseInt(md[metadataEventID]), Metadata: md,
		OrderingKey: md[metadataOrderKey], OrderingSeq: parseInt(md[metadataOrderSeq]), msg: msg}
}

// parseInt reads a decimal metadata value, 0 when it is missing or not a
// number. A missing one (the ordering sequence of an unordered event) is
// not parsed: strconv's error for it would be allocated, on every delivery.
func parseInt(s string) int64 {
	if s == "" {
		return 0
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0
	}
	return n
}

// PermanentError marks a failure that retrying cannot fix; the bus
// dead-letters the event at once.
type PermanentError struct {
	// Err is the cause, which Error quotes and Unwrap returns.
	Err error
}

// Error returns the cause's text.
func (e *PermanentError) Error() string {
	if e.Err == nil {
		return "permanent failure"
	}
	return "permanent failure: " + e.Err.Error()
}

// Unwrap returns the cause.
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent wraps err so that the event is dead-lettered without retry.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// IsPermanent reports whether err is, or wraps, a PermanentError.
func IsPermanent(err error) bool {
	if err == nil {
		return false // without allocating the target errors.As needs
	}
	var p *PermanentError
	return errors.As(err, &p)
}

// Func handles one decoded event of type T.
type Func[T any] func(ctx context.Context, event T, meta Meta) error

// Option configures a handler built by New.
type Option func(*Policy)

// WithMaxAttempts sets the attempt limit (1-100).
func WithMaxAttempts(n int) Option { return func(p *Policy) { p.MaxAttempts = n } }

// WithBackoff sets the retry delay function.
func WithBackoff(f func(attempt int) time.Duration) Option {
	return func(p *Policy) { p.Backoff = f }
}

// WithLease sets the lease (1 s-1 h).
func WithLease(d time.Duration) Option { return func(p *Policy) { p.Lease = d } }

// WithMaxInFlight sets how many events of the handler run at once.
func WithMaxInFlight(n int) Option { return func(p *Policy) { p.MaxInFlight = n } }

// WithHoldClaims makes the handler's subscriber hold its claims
// (outbox.SubscriberConfig.HoldClaims: PostgreSQL and MySQL; fewer writes per
// delivery, no AcknowledgeInTx), once it has run for the bus's
// Subscriber.HoldClaimsAfter (default twice the lease; leased claims
// before). Suits handlers that finish within seconds and keep no
// exactly-once effects of their own.
func WithHoldClaims() Option { return func(p *Policy) { p.HoldClaims = true } }

// WithDeadLetterPolicy sets what a dead-lettered event with an ordering key
// does to the later events of its key (default: the bus's, which holds
// unless its Config.Subscriber says skip).
func WithDeadLetterPolicy(d DeadLetterPolicy) Option {
	return func(p *Policy) { p.DeadLetterPolicy = d }
}

type typed[T any] struct {
	name, stream, kind string
	policy             Policy
	fn                 Func[T]
}

// New returns a Handler named name (its consumer group) for events of kind
// on stream, decoding each JSON payload into T. A payload that does not
// decode (JSON null included, and a decoder that panics) is dead-lettered
// at once with a reason that quotes none of it. An error fn returns, or a
// panic (its value and stack, the stack without the frames' argument
// values, which would show the event's fields), becomes the event's last
// error as fn wrote it (sanitised, cut to 512 bytes), shown to operators
// and logged by the router: keep payload content and secrets out of them.
// It panics if fn is nil, as net/http does for a nil handler func; the bus
// checks name, stream and kind.
func New[T any](name, stream, kind string, fn Func[T], opts ...Option) Handler {
	if fn == nil {
		panic("handlers: nil handler func for " + name)
	}
	h := &typed[T]{name: name, stream: stream, kind: kind, fn: fn}
	for _, opt := range opts {
		opt(&h.policy)
	}
	return h
}

func (h *typed[T]) Name() string   { return h.name }
func (h *typed[T]) Stream() string { return h.stream }
func (h *typed[T]) Kind() string   { return h.kind }
func (h *typed[T]) Policy() Policy { return h.policy }

// decodeError reports a payload that does not decode into a handler's type.
// Its text becomes the event's last error (dead letters, the CLI, the admin
// UI) and the router's log line, so it names the handler, the kind, the Go
// type and, for encoding/json's syntax and type errors, where and what
// went wrong, but never the decoder's own message: that can quote the
// payload (a number, a time that does not parse, a ",string" value, map
// keys in a field path, whatever a custom UnmarshalJSON returns). Unwrap
// gives the decoder's error to errors.As.
type decodeError struct {
	handler, kind, into string
	err                 error
}

func (e *decodeError) Error() string {
	head := fmt.Sprintf("handler %s: decode %s payload into %s", e.handler, e.kind, e.into)
	var syntax *json.SyntaxError
	var mismatch *json.UnmarshalTypeError
	switch {
	case errors.Is(e.err, errNullPayload):
		return head + ": " + errNullPayload.Error()
	case errors.As(e.err, &syntax):
		return fmt.Sprintf("%s: invalid JSON at byte offset %d", head, syntax.Offset)
	case errors.As(e.err, &mismatch):
		what, _, _ := strings.Cut(mismatch.Value, " ") // "number -5": its literal stays out
		return fmt.Sprintf("%s: a JSON %s at byte offset %d cannot be a Go %s", head, what, mismatch.Offset, mismatch.Type)
	default:
		return head + ": the payload does not decode (the decoder's message is withheld: it may quote the payload)"
	}
}

func (e *decodeError) Unwrap() error { return e.err }

// errNullPayload reports a payload that is JSON null: encoding/json would
// leave the event its zero value, and the handler would act on an event
// that says nothing (an order 0, a nil pointer).
var errNullPayload = errors.New("the payload is JSON null")

// decode decodes a payload into event. A null payload is refused, and a
// panic of the decoding (a custom UnmarshalJSON) is an error: its value
// stays out of the text like the decoder's messages.
func decode[T any](payload []byte, event *T) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("decoding panicked: %v", r)
		}
	}()
	if bytes.Equal(bytes.TrimSpace(payload), []byte("null")) {
		return errNullPayload
	}
	return json.Unmarshal(payload, event)
}

// Handle decodes the payload and calls the function; a panic becomes an
// error carrying the panic value and stack (without argument values).
func (h *typed[T]) Handle(msg *message.Message) (err error) {
	// Decoding outgrows a new goroutine's first stack (Watermill's router
	// runs every message in one): grow it once, while it is shallow. The
	// bus does so before its middleware already, with fewer frames on the
	// stack; here it then only clears a frame.
	gostack.Grow()
	var event T
	if err := decode(msg.Payload, &event); err != nil {
		return Permanent(&decodeError{handler: h.name, kind: h.kind, into: fmt.Sprintf("%T", event), err: err})
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("handler %s: panic: %v\n%s", h.name, r, panicstack.Stack())
		}
	}()
	if err := h.fn(msg.Context(), event, MetaOf(msg)); err != nil {
		return fmt.Errorf("handler %s: %w", h.name, err)
	}
	return nil
}
