package outbox

import (
	"errors"

	"github.com/millpond/millpond/internal/sqlcore"
)

// Errors returned by the store; test them with errors.Is.
var (
	// ErrInvalidKey reports a stream, event key, event kind, consumer group
	// or worker id outside 1-128 characters of [A-Za-z0-9._:-].
	ErrInvalidKey = sqlcore.ErrInvalidKey
	// ErrPayloadTooLarge reports a payload above MaxPayloadBytes.
	ErrPayloadTooLarge = sqlcore.ErrPayloadTooLarge
	// ErrInvalidMetadata reports metadata above MaxMetadataBytes or with an
	// empty key.
	ErrInvalidMetadata = sqlcore.ErrInvalidMetadata
	// ErrInvalidLease reports a lease outside MinLease-MaxLease.
	ErrInvalidLease = sqlcore.ErrInvalidLease
	// ErrInvalidAttempts reports an attempt limit outside 1-MaxAttempts.
	ErrInvalidAttempts = sqlcore.ErrInvalidAttempts
	// ErrInvalidDelay reports a delay outside 0-MaxDelay.
	ErrInvalidDelay = sqlcore.ErrInvalidDelay
	// ErrInvalidErrorText reports failure text that is empty, too long, not
	// UTF-8 or with control characters.
	ErrInvalidErrorText = sqlcore.ErrInvalidErrorText
	// ErrInvalidBatch reports a batch size outside its bound.
	ErrInvalidBatch = sqlcore.ErrInvalidBatch
	// ErrInvalidID reports an event id that is not positive.
	ErrInvalidID = sqlcore.ErrInvalidID
	// ErrInvalidClaimKey reports a malformed claim key.
	ErrInvalidClaimKey = sqlcore.ErrInvalidClaimKey
	// ErrInvalidHorizon reports a negative purge horizon.
	ErrInvalidHorizon = sqlcore.ErrInvalidHorizon
	// ErrIdempotencyConflict reports an event key that already exists in
	// the stream with a different kind or payload.
	ErrIdempotencyConflict = sqlcore.ErrIdempotencyConflict
	// ErrStaleClaim reports a claim key that no longer owns its event;
	// nothing was changed.
	ErrStaleClaim = sqlcore.ErrStaleClaim
	// ErrSchemaOutdated reports a database whose schema lacks columns this
	// version of millpond needs: its migrations have not all run (see
	// Store.CheckSchema).
	ErrSchemaOutdated = sqlcore.ErrSchemaOutdated
	// ErrSchemaNotInstalled is wrapped, with ErrSchemaOutdated, by
	// CheckSchema when the database holds no millpond table at all (as
	// opposed to a schema whose migrations are not all applied).
	ErrSchemaNotInstalled = sqlcore.ErrSchemaNotInstalled
	// ErrMigrationLockTimeout is wrapped by Migrate and MigrateDown when
	// their context ended while another transaction held a table they must
	// lock, through every try (see WithMigrationLockTimeout). The try in
	// progress was rolled back: the schema is at an earlier version, usable
	// by the version running on it; run the migration again.
	ErrMigrationLockTimeout = sqlcore.ErrMigrationLockTimeout
	// ErrMigrationInProgress is wrapped by Migrate and MigrateDown when
	// their context ended while they waited for the database's migration
	// lock (PostgreSQL, MariaDB/MySQL; SQLite has none): another process (a replica starting at the same time, or
	// millpond migrate) was migrating it. This one changed nothing; the
	// schema is at whatever version the other migration leaves.
	ErrMigrationInProgress = sqlcore.ErrMigrationInProgress
	// ErrInvalidSelector reports a DeadSelector that names none or more than
	// one of ids, a kind, or all of a group.
	ErrInvalidSelector = sqlcore.ErrInvalidSelector
	// ErrGroupNotDrained reports a RetireGroup refused because the group
	// still has pending or processing events; nothing was changed.
	ErrGroupNotDrained = sqlcore.ErrGroupNotDrained
	// ErrGroupNotRegistered reports a RetireGroup of a group that is not
	// registered for the stream and has nothing to discard.
	ErrGroupNotRegistered = sqlcore.ErrGroupNotRegistered
	// ErrInvalidPolicy reports a dead-letter policy other than
	// DeadLetterHold and DeadLetterSkip.
	ErrInvalidPolicy = sqlcore.ErrInvalidPolicy
	// ErrNoTransaction reports an Enqueue or Publish without an open
	// transaction: the outbox never opens one implicitly, so an event cannot
	// commit apart from the data it describes.
	ErrNoTransaction = errors.New("outbox: an open transaction is required (outbox.SQLTx or outbox.PgxTx); refusing an implicit one")
	// ErrNestedTransaction reports Store.InTx called with the context of
	// an InTx of the same store that is still running.
	ErrNestedTransaction = errors.New("outbox: InTx called inside an InTx of the same store; pass its tx on instead of opening a second transaction")
	// ErrInvalidDuration reports a SubscriberConfig duration out of its
	// bounds: a PollInterval below 1 ms or a negative CloseTimeout.
	ErrInvalidDuration = errors.New("outbox: duration out of bounds")
	// ErrClosed reports use of a closed Publisher or Subscriber.
	ErrClosed = errors.New("outbox: closed")
)

// Bounds on inputs.
const (
	// MaxKeyLen is the longest stream, event key, kind, group or worker id.
	MaxKeyLen = sqlcore.MaxKeyLen
	// MaxPayloadBytes is the largest payload.
	MaxPayloadBytes = sqlcore.MaxPayloadBytes
	// MaxMetadataBytes is the largest metadata, as stored JSON.
	MaxMetadataBytes = sqlcore.MaxMetadataBytes
	// MaxErrorBytes is the longest stored failure text.
	MaxErrorBytes = sqlcore.MaxErrorBytes
	// MinLease is the shortest lease.
	MinLease = sqlcore.MinLease
	// MaxLease is the longest lease.
	MaxLease = sqlcore.MaxLease
	// MaxAttempts is the highest attempt limit.
	MaxAttempts = sqlcore.MaxAttemptsLimit
	// MaxDelay is the longest retry or enqueue delay.
	MaxDelay = sqlcore.MaxDelay
	// MaxBatch is the largest batch of one call.
	MaxBatch = sqlcore.MaxBatch
	// MaxPurgeBatch is the most rows one Purge removes.
	MaxPurgeBatch = sqlcore.MaxPurgeBatch
)

// ErrOpen is wrapped by the driver packages' Open errors when the database
// could not be reached or its driver refused the address; the error's text
// names the address with its password hidden.
var ErrOpen = errors.New("could not open the database")
