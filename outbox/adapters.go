package outbox

import (
	"context"
	"database/sql"
	"sync"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"

	"github.com/millpond/millpond/internal/sqlcore"
)

// The store reuses watermill-sql's adapters between pgx/v5, database/sql and
// its executor interfaces; these small types restate their results as the
// internal core's interfaces and, on SQLite, queue the store's own writes.

type executor struct{ wsql.ContextExecutor }

func (e executor) ExecContext(ctx context.Context, query string, args ...any) (sqlcore.Result, error) {
	return e.ContextExecutor.ExecContext(ctx, query, args...)
}

func (e executor) QueryContext(ctx context.Context, query string, args ...any) (sqlcore.Rows, error) {
	return e.ContextExecutor.QueryContext(ctx, query, args...)
}

type transaction struct {
	executor
	tx      wsql.Tx
	release func() // lets the next queued statement of the store run; nil without a gate
}

func (t transaction) Commit() error {
	defer t.done()
	return t.tx.Commit()
}

func (t transaction) Rollback() error {
	defer t.done()
	return t.tx.Rollback()
}

func (t transaction) done() {
	if t.release != nil {
		t.release()
	}
}

type database struct {
	executor
	beginner  wsql.Beginner
	transient func(error) bool
	gate      *writeGate // nil but on SQLite
}

// Transient tells the core which errors abort a transaction that may be
// run again, as the driver package knows them.
func (d database) Transient(err error) bool { return d.transient != nil && d.transient(err) }

func (d database) BeginTx(ctx context.Context, opts *sql.TxOptions) (sqlcore.Tx, error) {
	release, err := d.gate.enter(ctx)
	if err != nil {
		return nil, err
	}
	tx, err := d.beginner.BeginTx(ctx, opts)
	if err != nil {
		release()
		return nil, err
	}
	return transaction{executor{tx}, tx, release}, nil
}

func (d database) ExecContext(ctx context.Context, query string, args ...any) (sqlcore.Result, error) {
	release, err := d.gate.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	return d.executor.ExecContext(ctx, query, args...)
}

func (d database) QueryContext(ctx context.Context, query string, args ...any) (sqlcore.Rows, error) {
	release, err := d.gate.enter(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := d.executor.QueryContext(ctx, query, args...)
	if err != nil {
		release()
		return nil, err
	}
	if d.gate == nil {
		return rows, nil
	}
	return &gatedRows{Rows: rows, release: release}, nil
}

func newDatabase(b wsql.Beginner, transient func(error) bool, gate *writeGate) database {
	return database{executor{b}, b, transient, gate}
}

// writeGate queues the store's own statements and transactions on a SQLite
// database one at a time. SQLite has a single writer: two of the store's
// connections that both want to write would otherwise meet in SQLite's busy
// handler, where the loser sleeps 1, 2, 5, 10, ... up to 100 ms per try
// however soon the lock frees, which made a bus of several subscribers
// (claims, acknowledgements and extensions of each) deliver at a quarter of
// a single subscriber's speed on some runs. Waiting here instead wakes the
// next statement the moment the previous one ends. Stores over the same
// *sql.DB share one gate; the application's own transactions and other
// processes still meet the store in the busy handler.
type writeGate struct{ turn chan struct{} }

// gates holds the gate of each SQLite *sql.DB a store was made over; a
// store that opened its database (sqlite.Open) drops the entry on Close.
var gates sync.Map // *sql.DB -> *writeGate

// gateFor returns the gate shared by every store over db.
func gateFor(db *sql.DB) *writeGate {
	g, _ := gates.LoadOrStore(db, &writeGate{turn: make(chan struct{}, 1)})
	return g.(*writeGate)
}

// enter waits for the gate (or ctx) and returns the function that leaves
// it, safe to call more than once. A nil gate lets everything through, and
// so does a ctx whose caller holds the gate's turn (Store.InTx).
func (g *writeGate) enter(ctx context.Context) (func(), error) {
	if g == nil || holds(ctx, g) {
		return func() {}, nil
	}
	select {
	case g.turn <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	var once sync.Once
	return func() { once.Do(func() { <-g.turn }) }, nil
}

// gatedRows leaves the gate when the rows are closed.
type gatedRows struct {
	sqlcore.Rows
	release func()
}

func (r *gatedRows) Close() error {
	defer r.release()
	return r.Rows.Close()
}

// Err reports the iteration error of the rows.
func (r *gatedRows) Err() error {
	if e, ok := r.Rows.(interface{ Err() error }); ok {
		return e.Err()
	}
	return nil
}
