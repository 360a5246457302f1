package sqlcore

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Migrations holds the schema as plain SQL files, one folder per dialect,
// named the way golang-migrate expects (NNNN_name.up.sql / .down.sql); the
// goose folder holds the same statements in goose's annotated form.
// MigrationsFS and GooseMigrationsFS (and the outbox functions of the same
// names) give one dialect's folder as the root of a file system.
//
//go:embed migrations
var Migrations embed.FS

// Migration is one versioned schema step.
type Migration struct {
	// Version orders migrations.
	Version int
	// Name describes the step.
	Name string
	// Up applies the step.
	Up string
	// Down reverts the step.
	Down string
}

// ErrUnknownDialect reports a dialect other than Postgres, MySQL and SQLite.
var ErrUnknownDialect = errors.New("unknown dialect")

// MigrationsFS returns the golang-migrate files of a dialect
// (NNNN_name.up.sql and NNNN_name.down.sql) at the root of a file system.
func MigrationsFS(d Dialect) (fs.FS, error) { return subFS(d, path.Join("migrations", string(d))) }

// GooseMigrationsFS returns the goose files of a dialect (NNNNN_name.sql
// with -- +goose Up and Down sections) at the root of a file system.
func GooseMigrationsFS(d Dialect) (fs.FS, error) {
	return subFS(d, path.Join("migrations", "goose", string(d)))
}

func subFS(d Dialect, dir string) (fs.FS, error) {
	if !d.Valid() {
		return nil, fmt.Errorf("%w %q: want %q, %q or %q", ErrUnknownDialect, string(d), Postgres, MySQL, SQLite)
	}
	return fs.Sub(Migrations, dir)
}

// LoadMigrations reads the embedded migrations of a dialect, in order.
func LoadMigrations(d Dialect) ([]Migration, error) {
	if !d.Valid() {
		return nil, fmt.Errorf("%w %q: want %q, %q or %q", ErrUnknownDialect, string(d), Postgres, MySQL, SQLite)
	}
	dir := path.Join("migrations", string(d))
	entries, err := fs.ReadDir(Migrations, dir)
	if err != nil {
		return nil, fmt.Errorf("read migrations of %s: %w", d, err)
	}
	byVersion := map[int]*Migration{}
	for _, e := range entries {
		name := e.Name()
		direction := ""
		switch {
		case strings.HasSuffix(name, ".up.sql"):
			direction = "up"
		case strings.HasSuffix(name, ".down.sql"):
			direction = "down"
		default:
			continue
		}
		num, title, ok := strings.Cut(name, "_")
		if !ok {
			return nil, fmt.Errorf("migration file %s has no version prefix", name)
		}
		version, err := strconv.Atoi(num)
		if err != nil {
			return nil, fmt.Errorf("migration file %s: %w", name, err)
		}
		body, err := fs.ReadFile(Migrations, path.Join(dir, name))
		if err != nil {
			return nil, err
		}
		m := byVersion[version]
		if m == nil {
			m = &Migration{Version: version, Name: strings.TrimSuffix(strings.TrimSuffix(title, ".up.sql"), ".down.sql")}
			byVersion[version] = m
		}
		if direction == "up" {
			m.Up = string(body)
		} else {
			m.Down = string(body)
		}
	}
	out := make([]Migration, 0, len(byVersion))
	for _, m := range byVersion {
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// statementsOf splits a migration for drivers that run one statement per
// call. PostgreSQL runs a whole file at once (its function bodies contain
// semicolons).
func (d Dialect) statementsOf(script string) []string {
	if d == Postgres {
		return []string{script}
	}
	var out []string
	for _, part := range strings.Split(script, ";\n") {
		if s := strings.TrimSpace(part); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// Migrate applies every migration not yet recorded, in order, under a
// database lock so concurrent processes migrate once. It is idempotent and
// never runs implicitly.
func (c *Core) Migrate(ctx context.Context) error {
	_, err := c.MigrateReport(ctx)
	return err
}

// MigrateReport is Migrate that also reports what it did: the migrations
// this call applied, in order, and the schema version afterwards.
func (c *Core) MigrateReport(ctx context.Context) (MigrateResult, error) {
	migrations, err := LoadMigrations(c.dialect)
	if err != nil {
		return MigrateResult{}, err
	}
	var res MigrateResult
	// kept lists the steps that earlier tries applied and that stay
	// applied: on MySQL each step commits with its DDL.
	var kept []Migration
	err = c.underMigrationLock(ctx, "migrate", func(tx Tx) (err error) {
		res = MigrateResult{Applied: slices.Clip(kept)}
		defer func() {
			if err != nil && c.dialect == MySQL {
				kept = res.Applied
			}
		}()
		if _, err := tx.ExecContext(ctx, c.stmts.migrationsDDL); err != nil {
			return fmt.Errorf("create migrations table: %w", err)
		}
		applied, err := c.queryIDs(ctx, tx, c.stmts.appliedSQL, nil)
		if err != nil {
			return fmt.Errorf("read applied migrations: %w", err)
		}
		now, err := c.resolveNow(ctx, tx)
		if err != nil {
			return err
		}
		for v := range applied {
			res.Version = max(res.Version, int(v))
		}
		// A schema another tool brought to version 4 or later (millpond_outbox
		// is then a view) already holds steps 1 to 4: they are recorded, not
		// run again (steps 1 to 3 alter millpond_outbox as a table).
		if !applied[sharedEventsVersion] {
			isView, err := c.outboxIsView(ctx, tx)
			if err != nil {
				return fmt.Errorf("inspect the schema: %w", err)
			}
			if isView {
				for _, m := range migrations {
					if m.Version > sharedEventsVersion || applied[int64(m.Version)] {
						continue
					}
					if _, err := tx.ExecContext(ctx, c.stmts.recordSQL, m.Version, m.Name, now); err != nil {
						return fmt.Errorf("record migration %d: %w", m.Version, err)
					}
					applied[int64(m.Version)] = true
					res.Version = max(res.Version, m.Version)
				}
			}
		}
		for _, m := range migrations {
			if applied[int64(m.Version)] {
				continue
			}
			for _, stmt := range c.dialect.statementsOf(m.Up) {
				if _, err := tx.ExecContext(ctx, stmt); err != nil {
					return fmt.Errorf("migration %d %s: %w", m.Version, m.Name, err)
				}
			}
			if _, err := tx.ExecContext(ctx, c.stmts.recordSQL, m.Version, m.Name, now); err != nil {
				return fmt.Errorf("record migration %d: %w", m.Version, err)
			}
			res.Applied = append(res.Applied, m)
			res.Version = max(res.Version, m.Version)
		}
		return nil
	})
	if err != nil {
		return MigrateResult{}, err
	}
	return res, nil
}

// sharedEventsVersion is the migration that stores each event once
// (millpond_events) and turns millpond_outbox into a view.
const sharedEventsVersion = 4

// outboxIsView reports whether millpond_outbox is a view: the schema is at
// version 4 or later, whoever migrated it.
func (c *Core) outboxIsView(ctx context.Context, tx Tx) (bool, error) {
	var q string
	switch c.dialect {
	case Postgres:
		q = "SELECT COUNT(*) FROM pg_class WHERE oid = to_regclass('millpond_outbox') AND relkind = 'v'"
	case MySQL:
		q = "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_outbox' AND TABLE_TYPE = 'VIEW'"
	default:
		q = "SELECT COUNT(*) FROM sqlite_master WHERE type = 'view' AND name = 'millpond_outbox'"
	}
	rows, err := tx.QueryContext(ctx, q)
	if err != nil {
		return false, err
	}
	defer rows.Close()
	var n int
	if rows.Next() {
		if err := rows.Scan(&n); err != nil {
			return false, err
		}
	}
	if err := rowsErr(rows); err != nil {
		return false, err
	}
	return n > 0, rows.Close()
}

// MigrateResult reports what a migration run did.
type MigrateResult struct {
	// Applied lists the migrations this run applied, oldest first; empty
	// when the schema was already up to date.
	Applied []Migration
	// Version is the highest migration recorded after the run.
	Version int
}

// MigrateDown reverts every migration, newest first, and drops the
// migrations table: all outbox data is deleted.
func (c *Core) MigrateDown(ctx context.Context) error {
	migrations, err := LoadMigrations(c.dialect)
	if err != nil {
		return err
	}
	return c.underMigrationLock(ctx, "migrate down", func(tx Tx) error {
		for i := len(migrations) - 1; i >= 0; i-- {
			if migrations[i].Version == sharedEventsVersion && c.dialect == SQLite {
				// SQLite's down step starts with DROP VIEW, which fails on
				// the table of a schema below version 4 (SQLite has no
				// conditional statements); the step runs in one
				// transaction, so no view means nothing to revert.
				isView, err := c.outboxIsView(ctx, tx)
				if err != nil {
					return fmt.Errorf("inspect the schema: %w", err)
				}
				if !isView {
					continue
				}
			}
			for _, stmt := range c.dialect.statementsOf(migrations[i].Down) {
				if _, err := tx.ExecContext(ctx, stmt); err != nil {
					return fmt.Errorf("revert migration %d: %w", migrations[i].Version, err)
				}
			}
		}
		_, err := tx.ExecContext(ctx, "DROP TABLE IF EXISTS millpond_schema_migrations")
		return err
	})
}

const migrateLockKey = 7_311_042_655_112_001

// DefaultMigrationLockTimeout bounds each wait of a migration for a lock on
// a table (see WithMigrationLockTimeout).
const DefaultMigrationLockTimeout = 3 * time.Second

// Backoff between two tries of a migration whose lock wait timed out: from
// the lock timeout itself (the application gets at least as long to run as
// it was held up), doubling, jittered, at most migrationRetryMax.
const migrationRetryMax = 30 * time.Second

// WithMigrationLockTimeout bounds each wait of Migrate and MigrateDown for
// a lock on a table (default DefaultMigrationLockTimeout; d <= 0 keeps
// it). When a wait times out the try is rolled back and run again after a
// backoff, until ctx ends. PostgreSQL sets it as the transaction's
// lock_timeout; MySQL and MariaDB as the session's lock_wait_timeout and
// innodb_lock_wait_timeout, in whole seconds (rounded up), restored after
// the migration.
func WithMigrationLockTimeout(d time.Duration) Option {
	return func(c *Core) {
		if d > 0 {
			c.migrationLockTimeout = d
		}
	}
}

// lockTimeout returns the migration lock timeout in force.
func (c *Core) lockTimeout() time.Duration {
	if c.migrationLockTimeout > 0 {
		return c.migrationLockTimeout
	}
	return DefaultMigrationLockTimeout
}

// underMigrationLock runs fn in a transaction that holds the migration lock,
// with every wait for a table lock bounded by the migration lock timeout
// (see boundLockWaits). A try whose lock wait timed out (or that a
// deadlock or SQLite's busy timeout ended) is rolled back and run again
// after a backoff while ctx lasts: the other sessions of the table, queued
// behind the migration's pending lock, then run. fn must be safe to run
// again after a failed try: on PostgreSQL and SQLite the rollback undoes
// it; on MySQL and MariaDB each DDL statement commits on its own and every
// step is written to continue from wherever an earlier try stopped.
//
// On PostgreSQL the transaction is READ COMMITTED whatever the server's
// default: a replica that waited for the lock then reads what the winner
// committed (under REPEATABLE READ it would read a snapshot from before,
// find nothing applied and run the first step again on the new schema).
func (c *Core) underMigrationLock(ctx context.Context, what string, fn func(Tx) error) error {
	var opts *sql.TxOptions
	if c.dialect == Postgres {
		opts = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}
	timeout := c.lockTimeout()
	var timedOut int
	var lastLockErr, last error
	b := &backoff.ExponentialBackOff{
		InitialInterval:     timeout,
		RandomizationFactor: 0.5,
		Multiplier:          2,
		MaxInterval:         max(migrationRetryMax, timeout),
	}
	// database/sql rolls a transaction back as soon as the context it began
	// with ends and hands its connection back to the pool, with MySQL's
	// session state (the named lock, the lock timeouts) still set: a MySQL
	// try begins without ctx's end, and unlock and restore run on the
	// still open transaction. Its migration statements run to their end
	// (see uninterrupted): a statement ctx stopped would only close the
	// connection, and the server would run it on, its lock wait queueing
	// the table's sessions and its DDL (0004's RENAME) committing after
	// Migrate returned.
	beginCtx := ctx
	if c.dialect == MySQL {
		beginCtx = context.WithoutCancel(ctx)
	}
	_, err := backoff.Retry(ctx, func() (struct{}, error) {
		last = inTx(beginCtx, c.db, opts, func(tx Tx) error {
			if err := c.lock(ctx, tx); err != nil {
				return err
			}
			defer c.unlock(ctx, tx)
			restore, err := c.boundLockWaits(ctx, tx, timeout)
			if err != nil {
				return err
			}
			defer restore()
			if c.dialect == MySQL {
				return fn(uninterrupted{Tx: tx, ctx: ctx})
			}
			return fn(tx)
		})
		switch {
		case last == nil:
			return struct{}{}, nil
		case lockWaitEnded(c.db, last):
			timedOut++
			lastLockErr = last
			if ctx.Err() == nil {
				return struct{}{}, last
			}
		}
		return struct{}{}, backoff.Permanent(last)
	},
		backoff.WithBackOff(b),
		backoff.WithMaxElapsedTime(0),
		backoff.WithNotify(func(err error, wait time.Duration) {
			if c.onConflict != nil {
				c.onConflict(what+" (a lock wait timed out: another transaction holds the table)", err, wait)
			}
		}))
	if err == nil {
		return nil
	}
	if timedOut > 0 && ctx.Err() != nil {
		return fmt.Errorf("%w: %d %s timed out after waiting %s for a lock (last: %w); stopped: %w",
			ErrMigrationLockTimeout, timedOut, plural(timedOut, "try", "tries"), timeout, lastLockErr, context.Cause(ctx))
	}
	if last != nil && !errors.Is(err, last) {
		return fmt.Errorf("%w (stopped: %w)", last, err)
	}
	return err
}

// uninterrupted is a MySQL migration's transaction: a statement runs to
// its end whether or not ctx ends meanwhile (each of its lock waits bounded
// by the lock timeout), and once ctx has ended no statement starts. The
// server does not stop a statement whose client closed the connection, so
// cancelling it would let Migrate return while the statement still waits
// for its lock, holding up the table's sessions, and then commits its DDL
// on a schema reported as left at its version.
type uninterrupted struct {
	Tx
	ctx context.Context
}

func (t uninterrupted) ExecContext(_ context.Context, query string, args ...any) (Result, error) {
	if err := t.ctx.Err(); err != nil {
		return nil, err
	}
	return t.Tx.ExecContext(context.WithoutCancel(t.ctx), query, args...)
}

func (t uninterrupted) QueryContext(_ context.Context, query string, args ...any) (Rows, error) {
	if err := t.ctx.Err(); err != nil {
		return nil, err
	}
	return t.Tx.QueryContext(context.WithoutCancel(t.ctx), query, args...)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// lockWaitEnded reports an error that ended a migration's try because a
// lock was not granted in time: PostgreSQL's lock_not_available (the
// lock_timeout) or deadlock, MySQL's lock wait timeout or deadlock, or
// SQLite's busy database (see retryable).
func lockWaitEnded(db DB, err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == "55P03" || pe.Code == "40P01"
	}
	return retryable(db, err)
}

// boundLockWaits bounds the migration's waits for table locks by timeout,
// once the migration lock is held (another migration is waited for as long
// as ctx allows): PostgreSQL's lock_timeout for the transaction (SET LOCAL
// ends with it); MySQL's and MariaDB's lock_wait_timeout (metadata locks:
// RENAME, ALTER, TRUNCATE) and innodb_lock_wait_timeout (rows) for the
// session, in whole seconds, which the returned function restores before
// the connection goes back to the pool. SQLite needs nothing: a session
// waiting for its write lock polls in the busy handler and holds up no one,
// and its busy timeout already bounds the wait.
func (c *Core) boundLockWaits(ctx context.Context, tx Tx, timeout time.Duration) (restore func(), err error) {
	switch c.dialect {
	case Postgres:
		ms := (timeout + time.Millisecond - 1) / time.Millisecond
		if _, err := tx.ExecContext(ctx, fmt.Sprintf("SET LOCAL lock_timeout = '%dms'", ms)); err != nil {
			return nil, fmt.Errorf("set the migration's lock timeout: %w", err)
		}
	case MySQL:
		var mdl, row int64
		rows, err := tx.QueryContext(ctx, "SELECT @@SESSION.lock_wait_timeout, @@SESSION.innodb_lock_wait_timeout")
		if err != nil {
			return nil, fmt.Errorf("read the session's lock timeouts: %w", err)
		}
		if rows.Next() {
			err = rows.Scan(&mdl, &row)
		}
		if err == nil {
			err = rowsErr(rows)
		}
		rows.Close()
		if err != nil {
			return nil, fmt.Errorf("read the session's lock timeouts: %w", err)
		}
		secs := int64((timeout + time.Second - 1) / time.Second)
		set := func(ctx context.Context, mdl, row int64) error {
			_, err := tx.ExecContext(ctx, fmt.Sprintf("SET SESSION lock_wait_timeout = %d, innodb_lock_wait_timeout = %d", mdl, row))
			return err
		}
		if err := set(ctx, secs, secs); err != nil {
			return nil, fmt.Errorf("set the migration's lock timeout: %w", err)
		}
		return func() {
			// Restored even when ctx has ended: the connection goes back
			// to the pool.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = set(rctx, mdl, row)
		}, nil
	}
	return func() {}, nil
}

func (c *Core) lock(ctx context.Context, tx Tx) error {
	var err error
	switch c.dialect {
	case Postgres:
		_, err = tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", int64(migrateLockKey))
	case MySQL:
		// A named lock is the server's: the name carries the database's,
		// so migrations of other databases on the server do not wait. It
		// is waited for as long as ctx allows, 5 s at a time (a long
		// migration of a big table may take minutes).
		for {
			var got sql.NullInt64
			rows, qerr := tx.QueryContext(ctx, "SELECT GET_LOCK("+mysqlMigrateLock+", 5)")
			if qerr != nil {
				err = qerr
				break
			}
			if rows.Next() {
				err = rows.Scan(&got)
			}
			rows.Close()
			if err != nil || got.Int64 == 1 {
				break
			}
			if err = ctx.Err(); err != nil {
				break
			}
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("take migration lock: %w: %w", ErrMigrationInProgress, err)
		}
		return fmt.Errorf("take migration lock: %w", err)
	}
	return nil
}

// mysqlMigrateLock names MySQL's migration lock after the database (a
// digest: a lock name has at most 64 characters).
const mysqlMigrateLock = "CONCAT('millpond_migrate:', SHA1(DATABASE()))"

// unlock releases MySQL's named lock, even when ctx has ended (a try the
// context stopped): the lock is the session's, and the connection goes back
// to the pool holding it otherwise, stalling every later migration of the
// database.
func (c *Core) unlock(ctx context.Context, tx Tx) {
	if c.dialect == MySQL {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = tx.ExecContext(rctx, "SELECT RELEASE_LOCK("+mysqlMigrateLock+")")
	}
}
