package sqlcore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

// insertedID returns the id of the row (MySQL: the first row) that the
// insert just run on ex generated, or 0 when the result says it generated
// none: MySQL counts a known key's row as affected when the connection
// asks for found rows (go-sql-driver's clientFoundRows), with no id. When
// the caller's executor does not report ids (watermill-sql's Result
// promises RowsAffected only), SQLite's last_insert_rowid() is read on the
// same connection: it runs only after an insert that changed rows, so it
// is that insert's. MySQL's LAST_INSERT_ID() would not do: an insert that
// generates no id leaves an earlier statement's value there.
func insertedID(ctx context.Context, d Dialect, ex Executor, res Result) (int64, error) {
	if r, ok := res.(interface{ LastInsertId() (int64, error) }); ok {
		id, err := r.LastInsertId()
		switch {
		case err != nil:
			return 0, err
		case id > 0:
			return id, nil
		case d == MySQL:
			return 0, nil
		}
		return 0, errNoInsertID
	}
	if d != SQLite {
		return 0, fmt.Errorf("%w: on MySQL the transaction's results must report LastInsertId (database/sql's do)", errNoInsertID)
	}
	var id int64
	if err := queryOne(ctx, ex, "SELECT last_insert_rowid()", nil, &id); err != nil && !errors.Is(err, errNoRow) {
		return 0, err
	}
	if id <= 0 {
		return 0, errNoInsertID
	}
	return id, nil
}

// errNoInsertID reports an insert whose result gave no id.
var errNoInsertID = errors.New("insert reported no id")

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

// Bounds of conflict retries: a statement or transaction that the database
// aborted to break a deadlock or a serialization conflict is run again up to
// conflictTries times in all, after a jittered exponential backoff from
// conflictBackoffFirst, at most conflictBackoffMax each (cenkalti/backoff).
const (
	conflictTries        = 6
	conflictBackoffFirst = 2 * time.Millisecond
	conflictBackoffMax   = 100 * time.Millisecond
)

// retryConflicts runs op, and runs it again while it fails with a conflict
// the database resolved by aborting it (see retryable), within
// conflictTries and ctx. Every retried conflict is reported to the core's
// observer, so a deadlock shows in the logs even when the retry succeeds.
// op must be safe to run again as a whole: one autocommit statement, or a
// whole transaction of the store's own; never a statement inside a caller's
// transaction, which the abort has ended.
func (c *Core) retryConflicts(ctx context.Context, what string, op func() error) error {
	var last error
	b := &backoff.ExponentialBackOff{
		InitialInterval:     conflictBackoffFirst,
		RandomizationFactor: 0.5,
		Multiplier:          2,
		MaxInterval:         conflictBackoffMax,
	}
	_, err := backoff.Retry(ctx, func() (struct{}, error) {
		last = op()
		if last != nil && !retryable(c.db, last) {
			return struct{}{}, backoff.Permanent(last)
		}
		return struct{}{}, last
	},
		backoff.WithBackOff(b),
		backoff.WithMaxTries(conflictTries),
		backoff.WithMaxElapsedTime(0),
		backoff.WithNotify(func(err error, wait time.Duration) {
			if c.onConflict != nil {
				c.onConflict(what, err, wait)
			}
		}))
	if err != nil && last != nil && !errors.Is(err, last) {
		// The context ended between two tries: report the database's error.
		return fmt.Errorf("%w (stopped retrying: %w)", last, err)
	}
	return err
}

// inTxRetry runs fn in a transaction of the core's database, committing on
// success, and runs the whole transaction again when the database aborts it
// to break a deadlock (InnoDB does now and then between concurrent SKIP
// LOCKED claims) or SQLite gives up waiting for its one writer lock. fn must
// reset any state it fills.
func (c *Core) inTxRetry(ctx context.Context, what string, opts *sql.TxOptions, fn func(Tx) error) error {
	return c.retryConflicts(ctx, what, func() error { return inTx(ctx, c.db, opts, fn) })
}

// retryable reports whether the database aborted a statement or transaction
// to resolve a conflict, after which the whole of it may simply be run
// again: PostgreSQL's deadlock_detected (40P01) and serialization_failure
// (40001), and what the driver package of db tells through its Transient
// method (MySQL's deadlock 1213, also as 1467, and lock wait timeout 1205, SQLite's
// "database is locked" after its busy timeout), so that this package links
// no driver but pgx.
func retryable(db DB, err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == "40P01" || pe.Code == "40001"
	}
	t, ok := db.(interface{ Transient(error) bool })
	return ok && t.Transient(err)
}
