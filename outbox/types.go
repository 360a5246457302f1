package outbox

import "github.com/millpond/millpond/internal/sqlcore"

// Event is what an application records in its transaction. String,
// GoString and LogValue redact its stream, key and payload.
type Event = sqlcore.Event

// Enqueued is the result of an idempotent enqueue: the event's id and
// whether this call inserted it.
type Enqueued = sqlcore.Enqueued

// Claimed is an event exclusively claimed until its lease expires. String,
// GoString and LogValue redact its stream, key, claim key and payload.
type Claimed = sqlcore.Claimed

// Receipt is the id and claim key that settle one claim; its claim key is
// redacted when printed or logged.
type Receipt = sqlcore.Receipt

// ClaimRequest asks for a batch of due events of one stream and group.
type ClaimRequest = sqlcore.ClaimRequest

// Failure says why a claim failed and when to retry.
type Failure = sqlcore.Failure

// FailOutcome tells whether Fail dead-lettered the event.
type FailOutcome = sqlcore.FailOutcome

// DeadEvent is a dead-lettered event.
type DeadEvent = sqlcore.DeadEvent

// DeadQuery selects dead-lettered events to list.
type DeadQuery = sqlcore.DeadQuery

// StreamStats counts the undelivered rows of one stream and group.
type StreamStats = sqlcore.StreamStats

// Migration is one versioned schema step, as plain SQL.
type Migration = sqlcore.Migration

// Row states, as stored in the status column.
const (
	StatusPending    = sqlcore.StatusPending
	StatusProcessing = sqlcore.StatusProcessing
	StatusDelivered  = sqlcore.StatusDelivered
	StatusDead       = sqlcore.StatusDead
)

// SanitizeErrorText turns any handler error text into valid failure text:
// control characters become spaces and the text is cut to MaxErrorBytes.
func SanitizeErrorText(text string) string { return sqlcore.SanitizeErrorText(text) }

// ValidateKey checks a stream, event key, event kind, consumer group or
// worker id: 1-128 characters of [A-Za-z0-9._:-]; the error wraps
// ErrInvalidKey and names the field.
func ValidateKey(field, value string) error { return sqlcore.ValidateKey(field, value) }
