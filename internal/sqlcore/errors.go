package sqlcore

import (
	"errors"
	"strings"
)

// Sentinel errors. Every error returned for bad input or a lost claim wraps
// one of these, so callers can test with errors.Is.
var (
	// ErrInvalidKey reports a stream, event key, event kind, consumer group
	// or worker id outside 1-128 characters of [A-Za-z0-9._:-].
	ErrInvalidKey = errors.New("invalid key")
	// ErrPayloadTooLarge reports a payload above MaxPayloadBytes.
	ErrPayloadTooLarge = errors.New("payload too large")
	// ErrInvalidMetadata reports metadata above MaxMetadataBytes or with an
	// empty key.
	ErrInvalidMetadata = errors.New("invalid metadata")
	// ErrInvalidLease reports a lease outside MinLease-MaxLease.
	ErrInvalidLease = errors.New("lease outside its bound")
	// ErrInvalidAttempts reports an attempt limit outside 1-MaxAttemptsLimit.
	ErrInvalidAttempts = errors.New("attempt limit outside its bound")
	// ErrInvalidDelay reports a retry or enqueue delay outside 0-MaxDelay.
	ErrInvalidDelay = errors.New("delay outside its bound")
	// ErrInvalidErrorText reports failure text that is empty, longer than
	// MaxErrorBytes, not UTF-8 or that contains control characters.
	ErrInvalidErrorText = errors.New("invalid failure text")
	// ErrInvalidBatch reports a batch size outside 1-MaxBatch.
	ErrInvalidBatch = errors.New("batch size outside its bound")
	// ErrInvalidID reports an event id that is not positive.
	ErrInvalidID = errors.New("invalid event id")
	// ErrInvalidClaimKey reports a claim key that is not 32 lowercase hex
	// characters.
	ErrInvalidClaimKey = errors.New("invalid claim key")
	// ErrInvalidHorizon reports a negative retention horizon.
	ErrInvalidHorizon = errors.New("invalid retention horizon")
	// ErrIdempotencyConflict reports an event key that already exists in the
	// stream with a different kind or payload.
	ErrIdempotencyConflict = errors.New("event key already exists in the stream with a different kind or payload")
	// ErrStaleClaim reports that the claim key no longer owns the event: the
	// lease expired, another worker reclaimed it, or it was already settled.
	// Nothing was changed.
	ErrStaleClaim = errors.New("claim is stale")
	// ErrSchemaOutdated reports a database whose schema lacks what this
	// version needs: its migrations have not all run.
	ErrSchemaOutdated = errors.New("the database schema is older than this version of millpond: run its migrations (Store.Migrate, millpond migrate, or the goose or golang-migrate files)")
	// ErrSchemaNotInstalled is wrapped, with ErrSchemaOutdated, when the
	// database holds no millpond table at all.
	ErrSchemaNotInstalled = errors.New("no millpond tables")
	// ErrMigrationLockTimeout reports a migration that could not take the
	// table locks it needs before its context ended: another transaction
	// held them through every try (each bounded by the migration lock
	// timeout). The try in progress was rolled back (on MySQL and MariaDB
	// the steps an earlier try completed stay applied): the schema is left
	// at an earlier version, usable by the version that runs on it.
	ErrMigrationLockTimeout = errors.New("the migration could not take its table locks: another transaction held them until the context ended")
	// ErrMigrationInProgress reports a migration that waited for the
	// migration lock of the database until its context ended: another
	// process (a replica starting at the same time, or millpond migrate)
	// was migrating it. Nothing was changed by this one.
	ErrMigrationInProgress = errors.New("another migration of this database held the migration lock until the context ended")
	// ErrInvalidSelector reports a selection of events that names none or
	// more than one of its alternatives (ids, a kind, all of a group).
	ErrInvalidSelector = errors.New("invalid selector")
	// ErrGroupNotDrained reports a consumer group that still has pending or
	// processing events, which retiring it would strand. Nothing was changed.
	ErrGroupNotDrained = errors.New("consumer group still has pending or processing events")
	// ErrGroupNotRegistered reports a consumer group that is not registered
	// for the stream and has nothing to discard. Nothing was changed.
	ErrGroupNotRegistered = errors.New("consumer group is not registered for the stream")
	// ErrInvalidPolicy reports a dead-letter policy other than hold and
	// skip.
	ErrInvalidPolicy = errors.New("invalid dead-letter policy")
)

// quotingErrors are the texts around the value that a MySQL or MariaDB
// error quotes from a statement's argument: 1366 (a character the
// connection's character set cannot hold, such as an emoji of a metadata
// value over charset=utf8, quoted with the bytes after it) and 1062 (a
// duplicate key). The value may itself hold a quote, so it ends at the
// last occurrence of its closing text.
var quotingErrors = []struct{ open, close string }{
	{"Incorrect string value: '", "' for column"},
	{"Duplicate entry '", "' for key"},
}

// valueError is a driver error whose text quoted a value, with the value
// hidden; Unwrap gives the driver's error to errors.Is and errors.As.
type valueError struct {
	text string
	err  error
}

func (e *valueError) Error() string { return e.text }
func (e *valueError) Unwrap() error { return e.err }

// hideQuotedValues returns err with the value that a MySQL or MariaDB error
// quotes (see quotingErrors) replaced by [REDACTED]; other errors as they
// are.
func hideQuotedValues(err error) error {
	if err == nil {
		return nil
	}
	text := err.Error()
	hidden := false
	for _, q := range quotingErrors {
		i := strings.Index(text, q.open)
		if i < 0 {
			continue
		}
		head := text[:i] + strings.TrimSuffix(q.open, "'") + redacted
		if end := strings.LastIndex(text, q.close); end >= i+len(q.open) {
			text = head + text[end+1:]
		} else {
			text = head // no closing text after the value: hide the rest
		}
		hidden = true
	}
	if !hidden {
		return err
	}
	return &valueError{text: text, err: err}
}
