package outbox

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/millpond/millpond/internal/sqlcore"
)

// The public types below are defined here, where users import them, with
// the same fields in the same order as their counterparts in
// internal/sqlcore, which runs the SQL and cannot import this package.
// Values cross the boundary by conversion (sqlcore.Event(ev)), which costs
// nothing and fails to compile if the two field lists ever differ. Their
// String, GoString, LogValue and MarshalJSON methods call the sqlcore ones,
// so the redaction rules live in one place.

// Row states, as stored in the status column and listed by Stats.
const (
	// StatusPending is a row waiting to be claimed (new, retried after a
	// failure, released or requeued).
	StatusPending = "pending"
	// StatusProcessing is a row claimed under a lease.
	StatusProcessing = "processing"
	// StatusDelivered is a row acknowledged by its consumer group.
	StatusDelivered = "delivered"
	// StatusDead is a dead-lettered row: its attempts ran out or the bus
	// found no handler for it.
	StatusDead = "dead_letter"
	// StatusBlocked is an event with an ordering key waiting for the
	// earlier events of its key, in its consumer group, to be settled; it is
	// not claimable until then.
	StatusBlocked = "blocked"
)

// DeadLetterPolicy says what a dead-lettered event with an ordering key
// does to the later events of its key in its consumer group; see
// DeadLetterHold and DeadLetterSkip.
type DeadLetterPolicy = sqlcore.DeadLetterPolicy

const (
	// DeadLetterHold (the default) keeps the key blocked behind its
	// dead-lettered event until that is requeued (it is then delivered
	// again, before the key's later events).
	DeadLetterHold = sqlcore.DeadLetterHold
	// DeadLetterSkip lets the next event of the key be claimed as soon as
	// its predecessor is dead-lettered.
	DeadLetterSkip = sqlcore.DeadLetterSkip
)

// Event is what an application records in its transaction with
// Store.Enqueue (the Publisher builds one from each Watermill message, see
// EventFromMessage).
//
// Stream, Key and Payload may carry tenant names, business identifiers or
// personal data, so String, GoString (%#v), LogValue (log/slog) and
// MarshalJSON print "[REDACTED]" in their place and show only Kind and the
// payload's length.
type Event struct {
	// Stream is the application's or tenant's stream, the Watermill topic:
	// 1-128 characters of [A-Za-z0-9._:-]. Consumer groups subscribe to
	// streams.
	Stream string
	// Key is the idempotency key, unique within the stream: enqueuing the
	// same key again with the same Kind and Payload returns the first
	// event's id; with other content, ErrIdempotencyConflict. 1-128
	// characters of [A-Za-z0-9._:-].
	Key string
	// Kind names the event's type (for example "OrderPlaced"); consumer
	// groups subscribe to kinds and the bus routes by it. 1-128 characters
	// of [A-Za-z0-9._:-].
	Kind string
	// Payload is the event's body, stored as bytes, at most
	// MaxPayloadBytes. The bus's typed handlers expect JSON.
	Payload []byte
	// Metadata travels with the event and becomes the Watermill message's
	// metadata (trace context, correlation ids): no empty key, at most
	// MaxMetadataBytes as the JSON object stored. It is not part of the
	// event's identity for idempotency.
	Metadata map[string]string
	// Delay postpones the first delivery by up to MaxDelay; zero delivers
	// as soon as the transaction commits.
	Delay time.Duration
	// OrderingKey, when set, orders the event among the events of the
	// same stream and ordering key (for example an aggregate's id): each
	// consumer group gets them one at a time, in the order their
	// transactions committed, the next only once the previous one is
	// settled; events of other keys go on in parallel. Empty (the default)
	// means unordered. 1-128 characters of [A-Za-z0-9._:-]; part of the
	// event's identity for idempotency. It may name a business entity, so
	// String, LogValue and MarshalJSON hide it.
	OrderingKey string
}

// Validate checks every bound of the event: the key fields, the payload
// size, the metadata keys and the delay. Enqueue validates too.
func (e Event) Validate() error { return sqlcore.Event(e).Validate() }

// String describes the event without its stream, key or payload.
func (e Event) String() string { return sqlcore.Event(e).String() }

// GoString is String, so %#v redacts too.
func (e Event) GoString() string { return sqlcore.Event(e).GoString() }

// Format writes String for every verb (%q quotes it), so that no verb
// (%d, %x, %s of the struct's fields) prints a secret.
func (e Event) Format(f fmt.State, verb rune) { sqlcore.Event(e).Format(f, verb) }

// LogValue redacts the event for log/slog.
func (e Event) LogValue() slog.Value { return sqlcore.Event(e).LogValue() }

// MarshalJSON redacts like LogValue, so a slice of events logged through
// slog's JSON handler (which marshals slices) hides them too.
func (e Event) MarshalJSON() ([]byte, error) { return sqlcore.Event(e).MarshalJSON() }

// Enqueued is the result of an idempotent enqueue.
type Enqueued struct {
	// ID is the event's row id: the lowest one when the event fanned out
	// to several consumer groups (one row each). For a known event whose
	// rows are all gone (acknowledged under WithDeleteOnAck, or
	// discarded, before Purge deleted the event) it is 0.
	ID int64
	// Inserted is true when this call recorded the event, false when an
	// event with the same key and the same content was already there.
	Inserted bool
}

// Receipt proves ownership of one claim: the row id and the claim's key.
// Acknowledge, Fail, Extend and Release need it. String, GoString,
// LogValue and MarshalJSON hide the claim key.
type Receipt struct {
	// ID is the claimed row's id.
	ID int64
	// ClaimKey is the claim's unguessable random token (32 hex digits);
	// a new claim of the same row gets a new key, so a worker whose lease
	// expired can no longer settle it.
	ClaimKey string
}

// String shows the id and hides the claim key.
func (r Receipt) String() string { return sqlcore.Receipt(r).String() }

// GoString is String, so %#v redacts too.
func (r Receipt) GoString() string { return sqlcore.Receipt(r).GoString() }

// Format writes String for every verb (%q quotes it), so that no verb
// (%d, %x, %s of the struct's fields) prints a secret.
func (r Receipt) Format(f fmt.State, verb rune) { sqlcore.Receipt(r).Format(f, verb) }

// LogValue redacts the claim key for log/slog.
func (r Receipt) LogValue() slog.Value { return sqlcore.Receipt(r).LogValue() }

// MarshalJSON redacts the claim key.
func (r Receipt) MarshalJSON() ([]byte, error) { return sqlcore.Receipt(r).MarshalJSON() }

// Claimed is an event exclusively claimed by one worker, for one consumer
// group, until its lease expires. String, GoString, LogValue and
// MarshalJSON hide its stream, group, key, claim key and payload.
type Claimed struct {
	// ID is the row id (one row per event and consumer group).
	ID int64
	// Stream is the event's stream.
	Stream string
	// Group is the consumer group this delivery belongs to ("" is the
	// stream's default group, which takes events no group subscribed to).
	Group string
	// Key is the event's idempotency key.
	Key string
	// Kind is the event's kind.
	Kind string
	// Payload is the event's body.
	Payload []byte
	// Metadata is the event's metadata.
	Metadata map[string]string
	// Attempts counts the claims of this delivery, this one included.
	Attempts int
	// ClaimKey must be presented (see Receipt) to settle this claim.
	ClaimKey string
	// LeaseExpiresAt is when the claim lapses and another worker may claim
	// the event again, by the database's clock.
	LeaseExpiresAt time.Time
	// CreatedAt is when the event was enqueued, by the database's clock.
	CreatedAt time.Time
	// OrderingKey is the event's ordering key, "" when it is unordered.
	OrderingKey string
	// OrderingSeq is the event's position among the events of its
	// ordering key in this consumer group (1 for the first, in commit
	// order); 0 when it is unordered.
	OrderingSeq int64
	// Reclaimed is true when this claim took the event over from an
	// earlier claim whose lease expired before it was settled (a crashed
	// or stalled worker), false for a first delivery or a retry after a
	// failure.
	Reclaimed bool
}

// Receipt returns the id and claim key that settle this claim.
func (c Claimed) Receipt() Receipt { return Receipt{ID: c.ID, ClaimKey: c.ClaimKey} }

// String describes the claim without stream, group, key, claim key or
// payload.
func (c Claimed) String() string { return sqlcore.Claimed(c).String() }

// GoString is String, so %#v redacts too.
func (c Claimed) GoString() string { return sqlcore.Claimed(c).GoString() }

// Format writes String for every verb (%q quotes it), so that no verb
// (%d, %x, %s of the struct's fields) prints a secret.
func (c Claimed) Format(f fmt.State, verb rune) { sqlcore.Claimed(c).Format(f, verb) }

// LogValue redacts the claim for log/slog.
func (c Claimed) LogValue() slog.Value { return sqlcore.Claimed(c).LogValue() }

// MarshalJSON redacts like LogValue.
func (c Claimed) MarshalJSON() ([]byte, error) { return sqlcore.Claimed(c).MarshalJSON() }

// ClaimRequest asks Store.Claim for up to Limit due events of one stream
// and consumer group, oldest first.
type ClaimRequest struct {
	// Stream to claim from.
	Stream string
	// Group is the consumer group to claim for ("" is the default group).
	Group string
	// Worker identifies the claimer in the row's claimed_by column, for
	// operators: 1-128 characters of [A-Za-z0-9._:-].
	Worker string
	// Limit is the most events to claim, 1-MaxBatch.
	Limit int
	// Lease is how long the claims hold before another worker may take the
	// events again, MinLease-MaxLease.
	Lease time.Duration
	// MaxAttempts is the attempt limit, 1-MaxAttempts: due events whose
	// attempts are used up (their last lease expired) are dead-lettered
	// instead of claimed.
	MaxAttempts int
	// DeadLetterPolicy is the consumer group's policy for events with an
	// ordering key that the claim dead-letters (their last lease expired);
	// the zero value is DeadLetterHold.
	DeadLetterPolicy DeadLetterPolicy
	// After, when positive, limits the claim to rows with a larger id
	// (Claimed.ID, the group's delivery row, not the event's own id);
	// 0 (the default) claims from the oldest, negative is ErrInvalidID. A
	// claimer that holds many claimed events and keeps finding full
	// batches can pass the largest id of its last claim, so that the next
	// claim does not step over the events it holds (the relay and the
	// Subscriber, leased or holding, do; see docs/architecture.md). Events
	// below the bound that become due (late commits, retries, expired
	// leases) wait until a claim without it: such a claimer must drop it
	// now and then. AcknowledgeAndClaimNext ignores it.
	After int64
}

// Validate checks every bound of the request. Claim validates too.
func (r ClaimRequest) Validate() error { return sqlcore.ClaimRequest(r).Validate() }

// Failure says why a claim failed and what to do next; see Store.Fail.
type Failure struct {
	// Reason is stored as the event's last error, shown in the dead-letter
	// list: valid UTF-8 without control characters, at most MaxErrorBytes
	// (SanitizeErrorText makes any text fit).
	Reason string
	// MaxAttempts dead-letters the event when its attempts have reached
	// it, 1-MaxAttempts.
	MaxAttempts int
	// RetryDelay postpones the next claim, 0-MaxDelay.
	RetryDelay time.Duration
	// DeadLetterPolicy is the consumer group's policy when an event with
	// an ordering key is dead-lettered; the zero value is DeadLetterHold.
	DeadLetterPolicy DeadLetterPolicy
}

// Validate checks every bound of the failure. Fail validates too.
func (f Failure) Validate() error { return sqlcore.Failure(f).Validate() }

// FailOutcome tells what Store.Fail did with the event.
type FailOutcome struct {
	// DeadLettered is true when the attempt limit was reached and the event
	// was dead-lettered, false when it will be retried.
	DeadLettered bool
}

// DeadEvent is a dead-lettered event, as Store.ListDead lists it. String,
// GoString, LogValue and MarshalJSON hide its stream, group and key.
type DeadEvent struct {
	// ID is the row id, to give to Store.Requeue or Store.Reroute.
	ID int64
	// Stream is the event's stream.
	Stream string
	// Group is the consumer group whose delivery died ("" for events no
	// group took, which the bus dead-letters as unrouted).
	Group string
	// Key is the event's idempotency key.
	Key string
	// Kind is the event's kind.
	Kind string
	// Attempts is the number of claims made before the event died.
	Attempts int
	// LastError is the last failure's reason.
	LastError string
	// CreatedAt is when the event was enqueued, by the database's clock.
	CreatedAt time.Time
}

// String describes the dead event without stream, group or key.
func (d DeadEvent) String() string { return sqlcore.DeadEvent(d).String() }

// GoString is String, so %#v redacts too.
func (d DeadEvent) GoString() string { return sqlcore.DeadEvent(d).GoString() }

// Format writes String for every verb (%q quotes it), so that no verb
// (%d, %x, %s of the struct's fields) prints a secret.
func (d DeadEvent) Format(f fmt.State, verb rune) { sqlcore.DeadEvent(d).Format(f, verb) }

// LogValue redacts the dead event for log/slog.
func (d DeadEvent) LogValue() slog.Value { return sqlcore.DeadEvent(d).LogValue() }

// MarshalJSON redacts like LogValue.
func (d DeadEvent) MarshalJSON() ([]byte, error) { return sqlcore.DeadEvent(d).MarshalJSON() }

// DeadQuery selects a page of dead-lettered events for Store.ListDead.
type DeadQuery struct {
	// Stream to list.
	Stream string
	// Group is the consumer group to list ("" is the default group);
	// ignored when AllGroups is set.
	Group string
	// AllGroups lists the dead letters of every consumer group of the
	// stream.
	AllGroups bool
	// AfterID pages: only ids above it are listed (pass the last id of the
	// previous page; zero starts at the beginning).
	AfterID int64
	// Limit is the page size, 1-MaxBatch.
	Limit int
}

// StreamStats counts the undelivered rows of one stream and consumer group,
// as Store.Stats reports them.
type StreamStats struct {
	// Stream is the stream.
	Stream string
	// Group is the consumer group ("" is the default group).
	Group string
	// Pending counts events waiting for a claim, delayed retries included.
	Pending int64
	// Processing counts claimed events (some leases may have expired).
	Processing int64
	// Dead counts dead-lettered events.
	Dead int64
	// Retrying counts the pending events that failed at least once and
	// wait for another attempt (their retry delay, then a claim); they are
	// included in Pending.
	Retrying int64
	// OldestPendingAge is the age of the oldest pending, blocked or
	// processing event by the database's clock, zero when there is none.
	OldestPendingAge time.Duration
	// Blocked counts events waiting behind an earlier event of their
	// ordering key.
	Blocked int64
	// HeldKeys counts ordering keys held by a dead-lettered event (under
	// DeadLetterHold): their later events wait until it is requeued.
	HeldKeys int64
}

// Migration is one versioned step of the outbox schema, as plain SQL for
// one dialect; see Migrations, MigrationsFS and GooseMigrationsFS.
type Migration struct {
	// Version orders the steps, from 1.
	Version int
	// Name describes the step, as in its file name (create_millpond).
	Name string
	// Up applies the step: one or more statements separated by ";" at the
	// end of a line (PostgreSQL runs the whole text at once).
	Up string
	// Down reverts the step. Every down step is idempotent.
	Down string
}

// SanitizeErrorText turns any handler error text into valid failure text:
// control characters become spaces and the text is cut to MaxErrorBytes.
func SanitizeErrorText(text string) string { return sqlcore.SanitizeErrorText(text) }

// ValidateKey checks a stream, event key, event kind, consumer group or
// worker id: 1-128 characters of [A-Za-z0-9._:-]; the error wraps
// ErrInvalidKey and names the field.
func ValidateKey(field, value string) error { return sqlcore.ValidateKey(field, value) }

// convert copies a slice element by element with f (a type conversion
// between identical struct types).
func convert[From, To any](in []From, f func(From) To) []To {
	if in == nil {
		return nil
	}
	out := make([]To, len(in))
	for i, v := range in {
		out[i] = f(v)
	}
	return out
}

func receiptToCore(r Receipt) sqlcore.Receipt         { return sqlcore.Receipt(r) }
func receiptFromCore(r sqlcore.Receipt) Receipt       { return Receipt(r) }
func claimedFromCore(c sqlcore.Claimed) Claimed       { return Claimed(c) }
func deadFromCore(d sqlcore.DeadEvent) DeadEvent      { return DeadEvent(d) }
func statsFromCore(s sqlcore.StreamStats) StreamStats { return StreamStats(s) }
func migrationFromCore(m sqlcore.Migration) Migration { return Migration(m) }
