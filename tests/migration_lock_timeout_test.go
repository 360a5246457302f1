package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// During a rolling update a replica of the previous version may hold a long
// transaction on millpond_outbox while the first replica of the new version
// runs Migrate. Migration 0004 locks the table (PostgreSQL: ACCESS
// EXCLUSIVE; MariaDB and MySQL: the metadata lock of its RENAME), and every
// other session of the table queues behind that pending request: Migrate
// used to wait without bound, and the application stalled for as long as
// the long transaction lasted. Each lock wait is now bounded by the
// migration lock timeout; the try is rolled back and run again later.

// migrationLockTimeouts are the short timeouts of these tests; MariaDB and
// MySQL count whole seconds.
var migrationLockTimeouts = map[string]time.Duration{"postgres": 300 * time.Millisecond, "mysql": time.Second}

// holdOutbox opens the long transaction of an old replica: on PostgreSQL a
// row update (its lock on the table conflicts with ACCESS EXCLUSIVE), on
// MariaDB and MySQL a read (its metadata lock lasts until the transaction
// ends, and RENAME waits for it).
func holdOutbox(t *testing.T, ctx context.Context, sdb *sql.DB, dialect, table string) *sql.Tx {
	t.Helper()
	long, err := sdb.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = long.Rollback() })
	q := "UPDATE " + table + " SET attempts = attempts WHERE id = (SELECT MIN(id) FROM " + table + ")"
	if dialect == "mysql" {
		q = "SELECT COUNT(*) FROM " + table
	}
	if _, err := long.ExecContext(ctx, q); err != nil {
		t.Fatal(err)
	}
	return long
}

// timedOp runs op with a context of twice bound and fails the test when it
// fails or takes longer than bound.
func timedOp(t *testing.T, ctx context.Context, what string, bound time.Duration, op func(context.Context) error) {
	t.Helper()
	opCtx, cancel := context.WithTimeout(ctx, 2*bound)
	defer cancel()
	start := time.Now()
	err := op(opCtx)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("%s while the migration waits for the long transaction: %v after %s (the migration's pending lock holds the table)", what, err, took.Round(time.Millisecond))
	}
	if took > bound {
		t.Fatalf("%s while the migration waits for the long transaction took %s, want at most %s", what, took.Round(time.Millisecond), bound)
	}
}

// TestMigrationLockWaitIsBounded: while an old replica's long transaction
// holds millpond_outbox, Migrate waits for its lock at most the lock
// timeout at a time, so the other sessions' writes and reads of the table
// complete within about that bound. Once the long transaction ends the
// migration succeeds with every row.
func TestMigrationLockWaitIsBounded(t *testing.T) {
	for _, dialect := range []string{"postgres", "mysql"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			timeout := migrationLockTimeouts[dialect]
			db, s, sdb := v3StoreWithRows(t, dialect, timeout)
			before := len(dumpOutbox(t, sdb, dialect))

			long := holdOutbox(t, ctx, sdb, dialect, "millpond_outbox")
			done := make(chan error, 1)
			go func() { done <- s.Migrate(ctx) }()
			waitForLockWait(t, sdb, dialect, done)

			// (a) Over several of the migration's tries, every write and
			// read of the table completes within the timeout and a margin.
			bound := timeout + time.Second
			var committed sync.Map
			for i, end := 0, time.Now().Add(3*timeout+time.Second); time.Now().Before(end); i++ {
				key := fmt.Sprintf("live-%d", i)
				timedOp(t, ctx, "an enqueue of an old replica", bound, func(ctx context.Context) error {
					return insertV3(ctx, sdb, dialect, key)
				})
				committed.Store(key, true)
				timedOp(t, ctx, "a read of an old replica", bound, func(ctx context.Context) error {
					var n int
					return sdb.QueryRowContext(ctx, "SELECT COUNT(*) FROM millpond_outbox").Scan(&n)
				})
				time.Sleep(20 * time.Millisecond)
			}
			select {
			case err := <-done:
				t.Fatalf("the migration ended while the long transaction held the table: %v", err)
			default:
			}

			// (b) The long transaction ends; the next try succeeds and
			// keeps every row.
			migrationCompletes(t, ctx, s, long, done, "the long transaction's end")
			n := requireNoLostEnqueues(t, ctx, sdb, "millpond_events", &committed, "by the old replica while the migration retried")
			if got := db.Count(t, "SELECT COUNT(*) FROM millpond_deliveries"); got != int64(before+n) {
				t.Errorf("%d delivery rows, want %d", got, before+n)
			}
		})
	}
}

// TestMigrationLockTimeoutEndsWithTheContext: when Migrate's context ends
// while the long transaction still holds the table, Migrate returns an
// error wrapping ErrMigrationLockTimeout (and the context's), soon after
// the deadline; the schema stays at version 3, the old replicas keep
// working on it, and a later Migrate completes with every row.
func TestMigrationLockTimeoutEndsWithTheContext(t *testing.T) {
	for _, dialect := range []string{"postgres", "mysql"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			timeout := migrationLockTimeouts[dialect]
			db, s, sdb := v3StoreWithRows(t, dialect, timeout)

			long := holdOutbox(t, ctx, sdb, dialect, "millpond_outbox")
			// Long enough for a try to time out on a loaded machine: the
			// error wraps ErrMigrationLockTimeout once one has.
			wait := max(3*timeout, 2*time.Second)
			short, cancel := context.WithTimeout(ctx, wait)
			defer cancel()
			start := time.Now()
			err := s.Migrate(short)
			took := time.Since(start)
			if !errors.Is(err, outbox.ErrMigrationLockTimeout) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Migrate while the table is held until its context ends: %v, want ErrMigrationLockTimeout and DeadlineExceeded", err)
			}
			t.Logf("after %s: %v", took.Round(time.Millisecond), err)
			if took > wait+timeout+time.Second {
				t.Errorf("Migrate returned %s after its context's deadline of %s", took-wait, wait)
			}
			if strings.Contains(err.Error(), db.URL) || strings.Contains(err.Error(), "://") {
				t.Errorf("the error quotes the database's address: %v", err)
			}

			// The schema is at version 3 and the old replicas' writes go
			// through at once, the long transaction still open.
			if v := db.Count(t, "SELECT MAX(version) FROM millpond_schema_migrations"); v != 3 {
				t.Errorf("schema version %d after the failed migration, want 3", v)
			}
			isTable := map[string]string{
				"postgres": "SELECT COUNT(*) FROM pg_class WHERE oid = to_regclass('millpond_outbox') AND relkind = 'r'",
				"mysql":    "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_outbox' AND TABLE_TYPE = 'BASE TABLE'",
			}[dialect]
			if db.Count(t, isTable) != 1 {
				t.Errorf("millpond_outbox is no longer the version-3 table")
			}
			if dialect == "mysql" {
				checkSessionLockTimeouts(t, ctx, sdb)
				// A try whose statement the context stopped had its
				// connection closed by the driver; the server ends that
				// session, and frees its named lock, once the statement's
				// lock wait ends: within the lock timeout.
				held := func() bool {
					return db.Count(t, "SELECT COUNT(IS_USED_LOCK(CONCAT('millpond_migrate:', SHA1(DATABASE()))))") != 0
				}
				for deadline := time.Now().Add(timeout + 3*time.Second); held() && time.Now().Before(deadline); {
					time.Sleep(50 * time.Millisecond)
				}
				if held() {
					t.Errorf("a connection still holds the migration lock %s after the failed migration", timeout+3*time.Second)
				}
			}
			timedOp(t, ctx, "an enqueue of an old replica after the failed migration", time.Second, func(ctx context.Context) error {
				return insertV3(ctx, sdb, dialect, "after-failure")
			})
			if err := long.Commit(); err != nil {
				t.Fatal(err)
			}
			want := dumpOutbox(t, sdb, dialect)

			again, cancel2 := context.WithTimeout(ctx, 15*time.Second)
			defer cancel2()
			if err := s.Migrate(again); err != nil {
				t.Fatalf("migrate again: %v", err)
			}
			if err := s.CheckSchema(ctx); err != nil {
				t.Errorf("schema after migrating again: %v", err)
			}
			compareDumps(t, "the view after migrating again", dumpOutbox(t, sdb, dialect), want)
		})
	}
}

// TestMigrateDownLockWaitIsBounded: MigrateDown locks the tables of the
// current schema the same way (PostgreSQL's down step of 0004 locks
// millpond_deliveries; MariaDB's of 0007 alters it). While a replica's
// long transaction holds millpond_deliveries, other sessions' reads of it
// complete within about the timeout, and when the context ends MigrateDown
// returns ErrMigrationLockTimeout with the schema and its events intact.
func TestMigrateDownLockWaitIsBounded(t *testing.T) {
	for _, dialect := range []string{"postgres", "mysql"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			timeout := migrationLockTimeouts[dialect]
			db := testdb.New(t, dialect)
			s := unmigratedStore(t, db, outbox.WithMigrationLockTimeout(timeout))
			if err := s.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			enqueueOne(t, s, "kept")
			sdb := s.SQLDB()
			want := dumpOutbox(t, sdb, dialect)

			long := holdOutbox(t, ctx, sdb, dialect, "millpond_deliveries")
			wait := max(3*timeout, 2*time.Second)
			short, cancel := context.WithTimeout(ctx, wait)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- s.MigrateDown(short) }()
			waitForLockWait(t, sdb, dialect, done)
			bound := timeout + time.Second
			for end := time.Now().Add(wait - 200*time.Millisecond); time.Now().Before(end); {
				timedOp(t, ctx, "a read of the deliveries", bound, func(ctx context.Context) error {
					var n int
					return sdb.QueryRowContext(ctx, "SELECT COUNT(*) FROM millpond_deliveries").Scan(&n)
				})
				time.Sleep(20 * time.Millisecond)
			}
			err := <-done
			if !errors.Is(err, outbox.ErrMigrationLockTimeout) {
				t.Fatalf("MigrateDown while the table is held until its context ends: %v, want ErrMigrationLockTimeout", err)
			}
			t.Logf("MigrateDown: %v", err)
			if err := long.Commit(); err != nil {
				t.Fatal(err)
			}
			if err := s.CheckSchema(ctx); err != nil {
				t.Errorf("schema after the failed MigrateDown: %v", err)
			}
			compareDumps(t, "the view after the failed MigrateDown", dumpOutbox(t, sdb, dialect), want)
		})
	}
}

// checkSessionLockTimeouts fails the test when a connection of the pool
// (every idle one is taken at once) kept the migration's lock timeouts
// instead of the server's.
func checkSessionLockTimeouts(t *testing.T, ctx context.Context, sdb *sql.DB) {
	t.Helper()
	var conns []*sql.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range sdb.Stats().OpenConnections {
		c, err := sdb.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		var mdl, globalMDL, row, globalRow int64
		if err := c.QueryRowContext(ctx, "SELECT @@SESSION.lock_wait_timeout, @@GLOBAL.lock_wait_timeout, @@SESSION.innodb_lock_wait_timeout, @@GLOBAL.innodb_lock_wait_timeout").
			Scan(&mdl, &globalMDL, &row, &globalRow); err != nil {
			t.Fatal(err)
		}
		if mdl != globalMDL || row != globalRow {
			t.Errorf("a pooled connection kept lock_wait_timeout %d and innodb_lock_wait_timeout %d (the server's: %d and %d)", mdl, row, globalMDL, globalRow)
		}
	}
}

// TestMigration0004RetriesAfterItsRenameOnMariaDB: MariaDB commits each DDL
// statement on its own, so a try of 0004 whose lock wait times out after
// its RENAME leaves the old table renamed. Here an earlier, interrupted
// try created millpond_deliveries, and a long transaction reads it: the
// next try renames millpond_outbox, then times out emptying
// millpond_deliveries, and is tried again (the rename kept: an old
// replica's write fails in its own statement meanwhile). Once the reader
// ends, a try continues from the renamed table and keeps every row.
func TestMigration0004RetriesAfterItsRenameOnMariaDB(t *testing.T) {
	ctx := context.Background()
	db := testdb.New(t, "mysql")
	var logs logLines
	s := openV3Store(t, db, outbox.WithMigrationLockTimeout(time.Second), outbox.WithLogger(logs.slog()))
	sdb := s.SQLDB()
	writeVersion3(t, sdb, "mysql", v4Rows())
	want := dumpOutbox(t, sdb, "mysql")
	execInOneSession(t, sdb, "partial up", through(t, mysqlStatements(t, "0004_shared_events.up.sql"), "CREATE TABLE IF NOT EXISTS millpond_deliveries"))

	long := holdOutbox(t, ctx, sdb, "mysql", "millpond_deliveries")
	done := make(chan error, 1)
	var res outbox.MigrateResult
	go func() {
		var err error
		res, err = s.MigrateReport(ctx)
		done <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); len(logs.matching("lock wait timed out")) == 0; {
		if time.Now().After(deadline) {
			t.Fatal("no try of the migration timed out within 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("logged: %s", logs.matching("lock wait timed out")[0])
	if n := db.Count(t, "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_outbox_0004'"); n != 1 {
		t.Fatalf("the try that timed out had not renamed millpond_outbox (%d tables millpond_outbox_0004)", n)
	}
	if err := insertV3(ctx, sdb, "mysql", "late"); err == nil {
		t.Error("an old replica's enqueue into millpond_outbox succeeded after the rename")
	}
	migrationCompletes(t, ctx, s, long, done, "the reader's end")
	var applied []int
	for _, m := range res.Applied {
		applied = append(applied, m.Version)
	}
	if fmt.Sprint(applied) != "[4 5 7]" || res.Version != 7 {
		t.Errorf("MigrateReport: applied %v, version %d; want [4 5 7] and 7", applied, res.Version)
	}
	compareDumps(t, "the view after the retried migration", dumpOutbox(t, sdb, "mysql"), want)
}

// TestMigrationCancelledMidWaitLeavesNothingRunningOnMariaDB: Migrate's
// context ends while 0004's RENAME waits for the metadata lock of an old
// replica's transaction. MariaDB does not stop a statement whose client
// closed its connection: cancelling the RENAME let Migrate return while
// the server still waited for the lock (every session of the table queued
// behind it, the migration lock held) and then, the old replica's
// transaction ended, renamed millpond_outbox under the old replicas of a
// schema reported as left at version 3. Once Migrate returned, nothing of
// it may still run: no statement waits, the migration lock is free, and
// the table stays where the failed migration left it.
func TestMigrationCancelledMidWaitLeavesNothingRunningOnMariaDB(t *testing.T) {
	ctx := context.Background()
	db := testdb.New(t, "mysql")
	timeout := 4 * time.Second // wide: the wait a cancelled RENAME would go on with
	s := openV3Store(t, db, outbox.WithMigrationLockTimeout(timeout))
	sdb := s.SQLDB()
	writeVersion3(t, sdb, "mysql", v4Rows())
	long := holdOutbox(t, ctx, sdb, "mysql", "millpond_outbox")
	mctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Migrate(mctx) }()
	waitForLockWait(t, sdb, "mysql", done)
	cancel() // mid-wait: the first try has not timed out
	var err error
	select {
	case err = <-done:
	case <-time.After(timeout + 5*time.Second):
		t.Fatal("Migrate did not return after its context ended")
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Migrate: %v, want the context's error", err)
	}
	var waiting, lockHeld int64
	if err := sdb.QueryRowContext(ctx, `SELECT
  (SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE() AND ID <> CONNECTION_ID() AND INFO LIKE 'RENAME%'),
  (SELECT COUNT(IS_USED_LOCK(CONCAT('millpond_migrate:', SHA1(DATABASE())))))`).Scan(&waiting, &lockHeld); err != nil {
		t.Fatal(err)
	}
	if waiting != 0 || lockHeld != 0 {
		t.Errorf("after Migrate returned (%v): %d statements of the migration still run, %d migration locks held", err, waiting, lockHeld)
	}
	if err := long.Commit(); err != nil { // the old replica's transaction ends
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if n := db.Count(t, "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_outbox' AND TABLE_TYPE = 'BASE TABLE'"); n != 1 {
		t.Errorf("millpond_outbox was renamed after Migrate returned %v", err)
	}
	if err := insertV3(ctx, sdb, "mysql", "after-cancel"); err != nil {
		t.Errorf("an old replica's enqueue after the cancelled migration: %v", err)
	}
}

// migrationCompletes commits the long transaction that held up a migration
// running in the background (its result comes on done), then requires the
// migration to succeed within 10 s of that (after) and the schema to be
// complete.
func migrationCompletes(t *testing.T, ctx context.Context, s *outbox.Store, long *sql.Tx, done <-chan error, after string) {
	t.Helper()
	if err := long.Commit(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("migrate: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the migration did not complete within 10 s of %s", after)
	}
	if err := s.CheckSchema(ctx); err != nil {
		t.Errorf("schema after the migration: %v", err)
	}
}

// v3StoreWithRows opens a new database of the dialect at schema version 3
// (the previous release's) holding rows in every state, through a store
// whose migration lock timeout is timeout.
func v3StoreWithRows(t *testing.T, dialect string, timeout time.Duration) (*testdb.Database, *outbox.Store, *sql.DB) {
	t.Helper()
	db := testdb.New(t, dialect)
	s := openV3Store(t, db, outbox.WithMigrationLockTimeout(timeout))
	sdb := s.SQLDB()
	writeVersion3(t, sdb, dialect, v4Rows())
	return db, s, sdb
}

// TestMigrationWaitingForAnotherMigrationSaysSo: a replica whose context
// ends while another process holds the database's migration lock (it is
// migrating) gets ErrMigrationInProgress, not a bare context error nor
// ErrMigrationLockTimeout, and changed nothing; once the lock is free it
// migrates.
func TestMigrationWaitingForAnotherMigrationSaysSo(t *testing.T) {
	for _, dialect := range []string{"postgres", "mysql"} {
		t.Run(dialect, func(t *testing.T) {
			ctx := context.Background()
			db := testdb.New(t, dialect)
			s := unmigratedStore(t, db)
			// The other migration: a session holding the lock Migrate takes.
			conn, err := s.SQLDB().Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			take, release := "SELECT pg_advisory_lock(7311042655112001)", "SELECT pg_advisory_unlock(7311042655112001)"
			if dialect == "mysql" {
				name := "CONCAT('millpond_migrate:', SHA1(DATABASE()))"
				take, release = "SELECT GET_LOCK("+name+", 0)", "SELECT RELEASE_LOCK("+name+")"
			}
			if _, err := conn.ExecContext(ctx, take); err != nil {
				t.Fatal(err)
			}
			released := false
			defer func() {
				if !released {
					_, _ = conn.ExecContext(ctx, release)
				}
			}()

			waitCtx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
			defer cancel()
			err = s.Migrate(waitCtx)
			if !errors.Is(err, outbox.ErrMigrationInProgress) {
				t.Fatalf("Migrate while another migration holds the lock: %v, want an error wrapping ErrMigrationInProgress", err)
			}
			if errors.Is(err, outbox.ErrMigrationLockTimeout) {
				t.Errorf("the wait for another migration was reported as a table lock timeout: %v", err)
			}
			if err := s.CheckSchema(ctx); !errors.Is(err, outbox.ErrSchemaNotInstalled) {
				t.Errorf("schema after the refused migration: %v, want none installed", err)
			}

			if _, err := conn.ExecContext(ctx, release); err != nil {
				t.Fatal(err)
			}
			released = true
			if err := s.Migrate(ctx); err != nil {
				t.Fatalf("Migrate once the lock is free: %v", err)
			}
		})
	}
}

// TestSQLiteMigrationWaitingForTheWriterGivesTheContextError: SQLite has
// no migration lock, so a migration whose context ends while another
// connection holds the database's write lock (whatever it writes) returns
// the context's error, as the documentation says, not
// ErrMigrationInProgress, and changed nothing.
func TestSQLiteMigrationWaitingForTheWriterGivesTheContextError(t *testing.T) {
	ctx := context.Background()
	db := testdb.New(t, "sqlite")
	s := unmigratedStore(t, db)
	conn, err := s.SQLDB().Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	tx, err := conn.BeginTx(ctx, nil) // BEGIN IMMEDIATE: the write lock
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, "CREATE TABLE other_writer (x INTEGER)"); err != nil {
		t.Fatal(err)
	}
	waitCtx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	err = s.Migrate(waitCtx)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, outbox.ErrMigrationInProgress) {
		t.Fatalf("Migrate while another connection writes: %v, want the context's error and not ErrMigrationInProgress", err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if err := s.CheckSchema(ctx); !errors.Is(err, outbox.ErrSchemaNotInstalled) {
		t.Errorf("schema after the refused migration: %v, want none installed", err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate once the writer is done: %v", err)
	}
}
