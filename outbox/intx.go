package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
)

// InTx runs fn in a new transaction on SQLDB: the application's own writes
// and the events they cause (Enqueue, AcknowledgeInTx, NewPublisher, all
// with SQLTx(tx)), committed together. It commits when fn returns nil; when
// fn returns an error it rolls back and returns that error as it is; when
// fn panics it rolls back and the panic goes on. It does not run fn again
// after a failed commit.
//
// On SQLite the transaction first waits for its turn in the store's write
// queue, the in-process queue in which the store's own claims,
// acknowledgements and lease extensions take turns. SQLite has one writer:
// transactions begun on the *sql.DB directly meet the store's statements,
// and each other, in SQLite's busy handler instead, which sleeps 1, 2, 5,
// ... up to 100 ms per retry however soon the lock frees. Store calls made
// inside fn with fn's ctx pass the queue (their turn is fn's); write
// through tx there, since a write of the store outside tx would wait for tx
// itself in the busy handler until the busy timeout. A store call inside fn
// with another context (context.Background(), say) waits in the queue for
// InTx to return, that is for ever or until that context ends: pass fn's
// ctx on. On PostgreSQL and MySQL InTx is a plain transaction.
//
// InTx called with the ctx of an InTx of the same store that is still
// running (a helper that wraps its own work in InTx, called from fn), also
// through an InTx of another store in between, or of another store over
// the same SQLite database, returns ErrNestedTransaction at once, on every
// dialect: a second transaction would commit apart from the first (and on
// SQLite wait for it). Take fn's tx as a parameter in such helpers instead.
func (s *Store) InTx(ctx context.Context, opts *sql.TxOptions, fn func(ctx context.Context, tx *sql.Tx) error) (err error) {
	if err := s.ready(ctx); err != nil {
		return err
	}
	if fn == nil {
		return errors.New("outbox: InTx: nil function")
	}
	db := s.SQLDB()
	if db == nil {
		return errors.New("outbox: InTx: the store has no database/sql handle")
	}
	outer, _ := ctx.Value(turnKey{}).(*turn)
	for o := outer; o != nil; o = o.outer {
		if o.held.Load() && (o.store == s || (o.gate != nil && o.gate == s.writes)) {
			return ErrNestedTransaction
		}
	}
	release, err := s.writes.enter(ctx)
	if err != nil {
		return fmt.Errorf("outbox: InTx: waiting for the write queue: %w", err)
	}
	defer release()
	t := &turn{store: s, gate: s.writes, outer: outer}
	t.held.Store(true)
	defer t.held.Store(false) // before release: a goroutine fn left behind queues again
	ctx = context.WithValue(ctx, turnKey{}, t)
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return fmt.Errorf("outbox: InTx: begin: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback() // fn failed or panicked: nothing of it stays
		}
	}()
	if err := fn(ctx, tx); err != nil {
		return err
	}
	committed = true
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("outbox: InTx: commit: %w", err)
	}
	return nil
}

// turnKey is the context key of a *turn.
type turnKey struct{}

// turn marks the context InTx hands its function: a nested InTx of the
// same store is refused, and on SQLite the store's calls made with it pass
// the write gate whose turn InTx holds instead of waiting for their own
// caller, until InTx returns (a subscription or goroutine started with
// that context then waits in the queue like any other).
type turn struct {
	store *Store
	gate  *writeGate // nil but on SQLite
	held  atomic.Bool
	outer *turn // the turn of an InTx (of another store) this one runs in
}

// holds reports whether ctx carries a turn of g that is still held, its
// own or one of an InTx it runs in.
func holds(ctx context.Context, g *writeGate) bool {
	if g == nil {
		return false
	}
	t, _ := ctx.Value(turnKey{}).(*turn)
	for ; t != nil; t = t.outer {
		if t.gate == g && t.held.Load() {
			return true
		}
	}
	return false
}
