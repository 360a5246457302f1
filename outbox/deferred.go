package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/millpond/millpond/internal/sqlcore"
)

// ErrNotOpened is returned by OpenDeferred for a Store that NewDeferred
// made and Close closed before it opened.
var ErrNotOpened = errors.New("outbox: the deferred store was closed before it opened")

// deferredOpen is how a NewDeferred store opens, and what came of it.
// Its fields but tried are guarded by the Store's mu.
type deferredOpen struct {
	open   func(ctx context.Context, opts ...Option) (*Store, error)
	opts   []Option
	opened bool
	err    error       // the first opening's error; OpenDeferred returns it again
	tried  atomic.Bool // opened or err is set: SQLDB and Pool skip the lock
}

// NewDeferred returns a Store of the dialect ("postgres", "mysql" or
// "sqlite") that holds no connection and runs no goroutine until
// OpenDeferred opens it, for wiring frameworks whose constructors run
// before the application starts and may never be followed by a start
// (package fxmodule: an fx.New that fails after its constructors ran
// runs no stop hook, so a store opened there would never be closed).
//
// open opens the database: it must pass the options it is given (opts,
// and one that makes the driver open into this Store) on to a driver
// package's Open (or anydb.Open) and return what that returns. Until the
// store opened, Dialect, Close, Watch and ListenerStatus work without
// opening it; every method that takes a context opens it first, with that
// context, and returns the opening's error if it fails (again on every
// later call: it opens at most once; but an opening its caller's context
// ended is tried again by the next call); SQLDB and Pool open it at once (with
// context.Background(): give open a timeout of its own) and return nil if
// that fails.
func NewDeferred(dialect string, open func(ctx context.Context, opts ...Option) (*Store, error), opts ...Option) (*Store, error) {
	d := sqlcore.Dialect(dialect)
	if !d.Valid() {
		return nil, fmt.Errorf("outbox: unknown dialect %q (want postgres, mysql or sqlite)", dialect)
	}
	if open == nil {
		return nil, errors.New("outbox: new deferred store: nil open function")
	}
	o := buildOptions(opts)
	// Subscribers made before the store opens choose their polling by
	// whether it will listen.
	wake := newWakeHub()
	wake.listening = d == sqlcore.Postgres && o.listen
	return &Store{dialect: d, wake: wake, deferred: &deferredOpen{open: open, opts: opts}}, nil
}

// OpenDeferred opens a Store made by NewDeferred; it does nothing for
// other stores, or once the store opened. It opens at most once: after a
// failure it returns the same error again (the error never shows the
// address's password, as the driver packages' Open), unless ctx had ended:
// an opening cut short by its caller's context (a readiness probe's, a
// request's) is not the store's failure, and the next call opens again.
func (s *Store) OpenDeferred(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.deferred
	switch {
	case d == nil || d.opened:
		return nil
	case d.err != nil:
		return d.err
	case s.closed:
		return ErrNotOpened
	}
	// The driver's Open fails (closing what it opened) for a database of
	// another dialect before it writes anything into s (see newStore).
	got, err := d.open(ctx, append(d.opts[:len(d.opts):len(d.opts)], func(o *storeOptions) { o.into = s })...)
	if err == nil && got != s {
		if got != nil {
			_ = got.Close()
		}
		err = errors.New("outbox: open deferred store: the open function did not pass its options on to the driver's Open")
	}
	if err != nil && ctx.Err() != nil {
		return err // nothing opened; tried stays false
	}
	if err != nil {
		d.err = err
		d.tried.Store(true)
		return err
	}
	d.opened = true
	d.tried.Store(true)
	return nil
}

// openOnDemand opens a NewDeferred store that has not opened yet, for
// SQLDB and Pool, which have no error to return: a failure is returned
// again by OpenDeferred (the application's start).
func (s *Store) openOnDemand() {
	if s.deferred != nil && !s.deferred.tried.Load() {
		_ = s.OpenDeferred(context.Background())
	}
}

// deferredOpened reports whether the store holds anything to close: every
// store but one of NewDeferred that has not opened. Callers hold s.mu.
func (s *Store) deferredOpened() bool { return s.deferred == nil || s.deferred.opened }

// ready opens a NewDeferred store that has not opened yet, with the
// caller's context, and returns the error of an opening that failed, for
// every method that takes a context: called before the application's start
// (from an fx.Invoke, say), such a method opens the store, as SQLDB does,
// instead of running on a store that holds nothing. Other stores pass at
// the cost of a nil check.
func (s *Store) ready(ctx context.Context) error {
	d := s.deferred
	if d == nil {
		return nil
	}
	if !d.tried.Load() {
		return s.OpenDeferred(ctx)
	}
	// opened and err were set before tried, and no longer change.
	if d.opened {
		return nil
	}
	return d.err
}
