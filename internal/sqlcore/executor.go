package sqlcore

import (
	"context"
	"database/sql"
	"math/rand/v2"
	"time"
)

// Result is what an executed statement reports.
type Result interface {
	RowsAffected() (int64, error)
}

// Rows iterates a query's result.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Close() error
}

// Executor runs statements: an open transaction, or a pool for the store's
// own autocommit work. It has the shape of watermill-sql's ContextExecutor,
// so its pgx and database/sql adapters can stand behind it.
type Executor interface {
	ExecContext(ctx context.Context, query string, args ...any) (Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (Rows, error)
}

// Tx is an open transaction owned by the store.
type Tx interface {
	Executor
	Commit() error
	Rollback() error
}

// DB is a pool the store uses for its own work.
type DB interface {
	Executor
	BeginTx(ctx context.Context, opts *sql.TxOptions) (Tx, error)
}

// rowsErr returns the iteration error of rows that report one (database/sql
// and pgx rows both do).
func rowsErr(rows Rows) error {
	if r, ok := rows.(interface{ Err() error }); ok {
		return r.Err()
	}
	return nil
}

// lastInsertID returns the first id a MySQL insert generated.
func lastInsertID(res Result) (int64, bool) {
	r, ok := res.(interface{ LastInsertId() (int64, error) })
	if !ok {
		return 0, false
	}
	id, err := r.LastInsertId()
	return id, err == nil && id > 0
}

// inTx runs fn in a transaction of db, committing on success.
func inTx(ctx context.Context, db DB, opts *sql.TxOptions, fn func(Tx) error) error {
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// inTxRetry is inTx for statements that are safe to run again as a whole:
// when the database aborts the transaction to break a deadlock (which
// InnoDB does now and then between concurrent SKIP LOCKED claims) or SQLite
// gives up waiting for its one writer lock, it runs fn again, up to three
// times. fn must reset any state it fills.
func inTxRetry(ctx context.Context, db DB, opts *sql.TxOptions, fn func(Tx) error) error {
	var err error
	for attempt := range 4 {
		if err = inTx(ctx, db, opts, fn); err == nil || !deadlocked(db, err) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(attempt+1) * time.Duration(1+rand.IntN(5)) * time.Millisecond):
		}
	}
	return err
}

// deadlocked reports whether err aborted a transaction that may simply be
// run again, as the database's driver tells (MySQL's "deadlock found" or
// "lock wait timeout", SQLite's "database is locked" after its busy
// timeout): a DB that knows its driver's errors has a Transient method.
func deadlocked(db DB, err error) bool {
	t, ok := db.(interface{ Transient(error) bool })
	return ok && t.Transient(err)
}
