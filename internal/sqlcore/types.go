package sqlcore

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/millpond/millpond/internal/safetext"
)

// Row states.
const (
	StatusPending    = "pending"
	StatusProcessing = "processing"
	StatusDelivered  = "delivered"
	StatusDead       = "dead_letter"
	// StatusBlocked is an event of an ordering key waiting for the
	// earlier events of its key (in its consumer group) to settle. It is
	// not claimable: the settlement of its predecessor promotes it to
	// pending.
	StatusBlocked = "blocked"
)

// DeadLetterPolicy says what a dead-lettered event with an ordering key
// does to the later events of its key in its consumer group.
type DeadLetterPolicy int

const (
	// DeadLetterHold keeps the key blocked until the dead letter is
	// requeued (it is then delivered again, first) or otherwise removed.
	// It is the default.
	DeadLetterHold DeadLetterPolicy = iota
	// DeadLetterSkip lets the next event of the key become claimable as
	// soon as the head is dead-lettered.
	DeadLetterSkip
)

// String names the policy.
func (p DeadLetterPolicy) String() string {
	switch p {
	case DeadLetterHold:
		return "hold"
	case DeadLetterSkip:
		return "skip"
	}
	return fmt.Sprintf("DeadLetterPolicy(%d)", int(p))
}

// Validate checks that p is one of the policies.
func (p DeadLetterPolicy) Validate() error {
	if p != DeadLetterHold && p != DeadLetterSkip {
		return fmt.Errorf("dead-letter policy %d is neither hold nor skip: %w", int(p), ErrInvalidPolicy)
	}
	return nil
}

const redacted = "[REDACTED]"

// Event is what an application records in its transaction.
type Event struct {
	// Stream is the application or tenant stream (the Watermill topic).
	Stream string
	// Key is the idempotency key, unique within the stream.
	Key string
	// Kind routes the event to its handlers.
	Kind string
	// Payload is the event body, at most MaxPayloadBytes.
	Payload []byte
	// Metadata travels with the event (Watermill metadata, trace context).
	// It is not part of the event's identity for idempotency.
	Metadata map[string]string
	// Delay postpones the first delivery; zero delivers at once.
	Delay time.Duration
	// OrderingKey, when set, delivers the events of one (stream, ordering
	// key) one at a time per consumer group, in commit order. Empty means
	// unordered.
	OrderingKey string
}

// Validate checks every bound of the event.
func (e Event) Validate() error {
	if err := ValidateKey("stream", e.Stream); err != nil {
		return err
	}
	if err := ValidateKey("event key", e.Key); err != nil {
		return err
	}
	if err := ValidateKey("event kind", e.Kind); err != nil {
		return err
	}
	if err := ValidateOrderingKey(e.OrderingKey); err != nil {
		return err
	}
	if len(e.Payload) > MaxPayloadBytes {
		return fmt.Errorf("payload is %d bytes, more than %d: %w", len(e.Payload), MaxPayloadBytes, ErrPayloadTooLarge)
	}
	for k := range e.Metadata {
		if k == "" {
			return fmt.Errorf("metadata has an empty key: %w", ErrInvalidMetadata)
		}
	}
	return ValidateDelay(e.Delay)
}

// String describes the event without its stream, key or payload.
func (e Event) String() string {
	return fmt.Sprintf("Event{Stream:%s Key:%s Kind:%s PayloadBytes:%d OrderingKey:%s}", redacted, redacted, e.Kind, len(e.Payload), redactIfSet(e.OrderingKey))
}

// GoString is String, so %#v redacts too.
func (e Event) GoString() string { return e.String() }

// Format writes String for every verb (%q quotes it), so that no verb
// prints the fields one by one.
func (e Event) Format(f fmt.State, verb rune) { safetext.Format(f, verb, e.String()) }

// LogValue redacts the event for log/slog.
func (e Event) LogValue() slog.Value {
	return slog.GroupValue(slog.String("stream", redacted), slog.String("key", redacted),
		slog.String("kind", e.Kind), slog.Int("payload_bytes", len(e.Payload)), slog.String("ordering_key", redactIfSet(e.OrderingKey)))
}

// redactIfSet hides an optional secret but shows that it is absent.
func redactIfSet(v string) string {
	if v == "" {
		return ""
	}
	return redacted
}

// MarshalJSON redacts like LogValue, so a slice of events logged through
// slog's JSON handler (which marshals slices) hides them too.
func (e Event) MarshalJSON() ([]byte, error) {
	return json.Marshal(map[string]any{"stream": redacted, "key": redacted, "kind": e.Kind, "payload_bytes": len(e.Payload), "ordering_key": redactIfSet(e.OrderingKey)})
}

// Enqueued is the result of an idempotent enqueue.
type Enqueued struct {
	// ID is the lowest row id of the event (one row per consumer group).
	ID int64
	// Inserted is true when this call wrote the event, false when the same
	// key with the same content was already there.
	Inserted bool
}

// Receipt proves ownership of one claim: the event id and its claim key.
type Receipt struct {
	// ID is the row id.
	ID int64
	// ClaimKey is the unguessable token of this claim.
	ClaimKey string
}

// String shows the id and hides the claim key.
func (r Receipt) String() string { return fmt.Sprintf("Receipt{ID:%d ClaimKey:%s}", r.ID, redacted) }

// GoString is String, so %#v redacts too.
func (r Receipt) GoString() string { return r.String() }

// Format writes String for every verb (%q quotes it), so that no verb
// prints the fields one by one.
func (r Receipt) Format(f fmt.State, verb rune) { safetext.Format(f, verb, r.String()) }

// LogValue redacts the claim key for log/slog.
func (r Receipt) LogValue() slog.Value {
	return slog.GroupValue(slog.Int64("id", r.ID), slog.String("claim_key", redacted))
}

// MarshalJSON redacts the claim key.
func (r Receipt) MarshalJSON() ([]byte, error) {
	return json.Marshal(map[string]any{"id": r.ID, "claim_key": redacted})
}

// Claimed is an event exclusively claimed by one worker until its lease expires.
type Claimed struct {
	// ID is the row id.
	ID int64
	// Stream is the event's stream.
	Stream string
	// Group is the consumer group this delivery belongs to ("" is the default).
	Group string
	// Key is the idempotency key.
	Key string
	// Kind is the routing kind.
	Kind string
	// Payload is the event body.
	Payload []byte
	// Metadata is the event's metadata.
	Metadata map[string]string
	// Attempts counts claims of this delivery, including this one.
	Attempts int
	// ClaimKey must be presented to settle this claim.
	ClaimKey string
	// LeaseExpiresAt is when another worker may reclaim the event.
	LeaseExpiresAt time.Time
	// CreatedAt is when the event was enqueued.
	CreatedAt time.Time
	// OrderingKey is the event's ordering key ("" when unordered).
	OrderingKey string
	// OrderingSeq is the event's position in its key's sequence within its
	// consumer group, from 1 (0 when unordered).
	OrderingSeq int64
	// Reclaimed is true when the event was claimed again because an
	// earlier claim's lease expired unsettled.
	Reclaimed bool
}

// Receipt returns the id and claim key that settle this claim.
func (c Claimed) Receipt() Receipt { return Receipt{ID: c.ID, ClaimKey: c.ClaimKey} }

// String describes the claim without stream, key, claim key or payload.
func (c Claimed) String() string {
	return fmt.Sprintf("Claimed{ID:%d Stream:%s Group:%s Key:%s Kind:%s PayloadBytes:%d Attempts:%d ClaimKey:%s LeaseExpiresAt:%s OrderingKey:%s OrderingSeq:%d}",
		c.ID, redacted, redacted, redacted, c.Kind, len(c.Payload), c.Attempts, redacted, c.LeaseExpiresAt.UTC().Format(time.RFC3339Nano), redactIfSet(c.OrderingKey), c.OrderingSeq)
}

// GoString is String, so %#v redacts too.
func (c Claimed) GoString() string { return c.String() }

// Format writes String for every verb (%q quotes it), so that no verb
// prints the fields one by one.
func (c Claimed) Format(f fmt.State, verb rune) { safetext.Format(f, verb, c.String()) }

// LogValue redacts the claim for log/slog.
func (c Claimed) LogValue() slog.Value {
	return slog.GroupValue(slog.Int64("id", c.ID), slog.String("stream", redacted), slog.String("key", redacted),
		slog.String("kind", c.Kind), slog.Int("payload_bytes", len(c.Payload)), slog.Int("attempts", c.Attempts),
		slog.String("claim_key", redacted), slog.Time("lease_expires_at", c.LeaseExpiresAt),
		slog.String("ordering_key", redactIfSet(c.OrderingKey)), slog.Int64("ordering_seq", c.OrderingSeq))
}

// MarshalJSON redacts like LogValue.
func (c Claimed) MarshalJSON() ([]byte, error) {
	return json.Marshal(map[string]any{"id": c.ID, "stream": redacted, "group": redacted, "key": redacted,
		"kind": c.Kind, "payload_bytes": len(c.Payload), "attempts": c.Attempts, "claim_key": redacted,
		"lease_expires_at": c.LeaseExpiresAt, "ordering_key": redactIfSet(c.OrderingKey), "ordering_seq": c.OrderingSeq})
}

// ClaimRequest asks for up to Limit due events of one stream and group.
type ClaimRequest struct {
	// Stream to claim from.
	Stream string
	// Group is the consumer group ("" is the default group).
	Group string
	// Worker identifies the claimer in the row, for operators.
	Worker string
	// Limit is the most events to claim (1-MaxBatch).
	Limit int
	// Lease is how long the claim holds (MinLease-MaxLease).
	Lease time.Duration
	// MaxAttempts dead-letters due events whose attempts are used up.
	MaxAttempts int
	// DeadLetterPolicy applies to events with an ordering key that the
	// claim dead-letters (their last lease expired).
	DeadLetterPolicy DeadLetterPolicy
	// After, when positive, limits the claim to rows with a larger id
	// (0 claims from the oldest). AcknowledgeAndClaimNext ignores it.
	After int64
}

// Validate checks every bound of the request.
func (r ClaimRequest) Validate() error {
	if r.After < 0 {
		return fmt.Errorf("claim lower bound %d is negative: %w", r.After, ErrInvalidID)
	}
	if err := ValidateKey("stream", r.Stream); err != nil {
		return err
	}
	if err := ValidateGroup(r.Group); err != nil {
		return err
	}
	if err := ValidateKey("worker id", r.Worker); err != nil {
		return err
	}
	if err := ValidateBatch(r.Limit); err != nil {
		return err
	}
	if err := ValidateLease(r.Lease); err != nil {
		return err
	}
	if err := r.DeadLetterPolicy.Validate(); err != nil {
		return err
	}
	return ValidateAttempts(r.MaxAttempts)
}

// Failure says why a claim failed and what to do next.
type Failure struct {
	// Reason is stored as the event's last error (see ValidateErrorText).
	Reason string
	// MaxAttempts dead-letters the event when its attempts reach it.
	MaxAttempts int
	// RetryDelay postpones the next claim (0-MaxDelay).
	RetryDelay time.Duration
	// DeadLetterPolicy applies when an event with an ordering key is
	// dead-lettered.
	DeadLetterPolicy DeadLetterPolicy
}

// Validate checks every bound of the failure.
func (f Failure) Validate() error {
	if err := ValidateErrorText(f.Reason); err != nil {
		return err
	}
	if err := ValidateAttempts(f.MaxAttempts); err != nil {
		return err
	}
	if err := f.DeadLetterPolicy.Validate(); err != nil {
		return err
	}
	return ValidateDelay(f.RetryDelay)
}

// FailOutcome tells what Fail did with the event.
type FailOutcome struct {
	// DeadLettered is true when the attempt limit was reached.
	DeadLettered bool
}

// DeadEvent is a dead-lettered event, for listing and requeue.
type DeadEvent struct {
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
	// Attempts is the number of claims made.
	Attempts int
	// LastError is the last failure text.
	LastError string
	// CreatedAt is when the event was enqueued.
	CreatedAt time.Time
}

// String describes the dead event without stream or key.
func (d DeadEvent) String() string {
	return fmt.Sprintf("DeadEvent{ID:%d Stream:%s Group:%s Key:%s Kind:%s Attempts:%d LastError:%q}",
		d.ID, redacted, redacted, redacted, d.Kind, d.Attempts, d.LastError)
}

// GoString is String, so %#v redacts too.
func (d DeadEvent) GoString() string { return d.String() }

// Format writes String for every verb (%q quotes it), so that no verb
// prints the fields one by one.
func (d DeadEvent) Format(f fmt.State, verb rune) { safetext.Format(f, verb, d.String()) }

// LogValue redacts the dead event for log/slog.
func (d DeadEvent) LogValue() slog.Value {
	return slog.GroupValue(slog.Int64("id", d.ID), slog.String("stream", redacted), slog.String("key", redacted),
		slog.String("kind", d.Kind), slog.Int("attempts", d.Attempts), slog.String("last_error", d.LastError))
}

// MarshalJSON redacts like LogValue.
func (d DeadEvent) MarshalJSON() ([]byte, error) {
	return json.Marshal(map[string]any{"id": d.ID, "stream": redacted, "group": redacted, "key": redacted,
		"kind": d.Kind, "attempts": d.Attempts, "last_error": d.LastError})
}

// StreamStats counts the rows of one stream and consumer group.
type StreamStats struct {
	// Stream is the stream name.
	Stream string
	// Group is the consumer group.
	Group string
	// Pending counts events waiting for a claim (including delayed retries).
	Pending int64
	// Processing counts claimed events (some leases may have expired).
	Processing int64
	// Dead counts dead-lettered events.
	Dead int64
	// Retrying counts the pending events that failed at least once and wait
	// for another attempt (included in Pending).
	Retrying int64
	// OldestPendingAge is the age of the oldest pending, blocked or
	// processing event, zero when there is none.
	OldestPendingAge time.Duration
	// Blocked counts events waiting behind an earlier event of their
	// ordering key.
	Blocked int64
	// HeldKeys counts ordering keys held by a dead-lettered event (under
	// DeadLetterHold): their later events wait until it is requeued.
	HeldKeys int64
}
