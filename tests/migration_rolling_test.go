package tests

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/outbox/anydb"
)

// A rolling update runs replicas of the previous version, which write the
// millpond_outbox table, while the first replica of the new one runs
// migration 0004 (or a tool runs it in its own transaction). Every enqueue
// of an old replica must either be kept by the migration or fail in the
// replica's own transaction (the order is refused, not silently lost): an
// old writer's row committed after the copy and before the drop of the old
// table used to be dropped with it.

// insertV3 writes one millpond_outbox row of the 0003 layout, as a
// replica of the previous version enqueues.
func insertV3(ctx context.Context, ex interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}, dialect, key string) error {
	cols := "stream, consumer_group, event_key, event_kind, payload, metadata, content_hash, status, attempts, available_at, created_at"
	vals := "?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?"
	payload := []byte("payload of " + key)
	args := []any{"m4", "billing", key, "Placed", payload, "{}", contentHashOf("Placed", payload, ""), "pending", 0, v4Base, v4Base}
	_, err := ex.ExecContext(ctx, rebind(dialect, "INSERT INTO millpond_outbox ("+cols+") VALUES ("+vals+")"), args...)
	return err
}

func openV3Store(t *testing.T, db *testdb.Database, opts ...outbox.Option) *outbox.Store {
	t.Helper()
	s := unmigratedStore(t, db, opts...)
	installVersion3(t, s.SQLDB(), db.Dialect)
	return s
}

// TestMigration0004KeepsAnOldReplicasInFlightEnqueue: an old replica's
// transaction has written its row but not committed when the migration
// starts. The migration must wait for it and copy the row.
func TestMigration0004KeepsAnOldReplicasInFlightEnqueue(t *testing.T) {
	for _, dialect := range []string{"postgres", "mysql"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.New(t, dialect)
			s := openV3Store(t, db)
			sdb := s.SQLDB()
			writeVersion3(t, sdb, dialect, v4Rows())
			before := len(dumpOutbox(t, sdb, dialect))

			old, err := sdb.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer old.Rollback()
			if err := insertV3(ctx, old, dialect, "in-flight"); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- s.Migrate(ctx) }()
			waitForLockWait(t, sdb, dialect, done)
			if err := old.Commit(); err != nil {
				// Refused in its own transaction: the order is not taken,
				// nothing is lost.
				t.Logf("the old replica's commit failed: %v", err)
			}
			if err := <-done; err != nil {
				t.Fatalf("migrate: %v", err)
			}
			after := dumpOutbox(t, sdb, dialect)
			if len(after) != before+1 {
				t.Errorf("after the migration the view has %d rows, want %d (the old replica's committed enqueue was dropped)", len(after), before+1)
			}
			// The old replica's next enqueue fails loudly.
			if err := insertV3(ctx, sdb, dialect, "after"); err == nil {
				t.Errorf("an old replica's enqueue into the migrated schema succeeded")
			}
		})
	}
}

// waitForLockWait returns once the migration waits for a lock that another
// session (the old replica) holds, or fails the test after 10 s.
func waitForLockWait(t *testing.T, db *sql.DB, dialect string, done chan error) {
	t.Helper()
	q := map[string]string{
		"postgres": "SELECT COUNT(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid WHERE NOT l.granted AND a.datname = current_database() AND a.application_name = current_setting('application_name')",
		"mysql":    "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE() AND ID <> CONNECTION_ID() AND (STATE LIKE 'Waiting for%lock%' OR STATE LIKE '%lock wait%' OR STATE = 'Sending data' AND INFO LIKE 'INSERT INTO millpond_%') AND INFO IS NOT NULL AND INFO NOT LIKE '%PROCESSLIST%'",
	}[dialect]
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-done:
			done <- err
			t.Logf("the migration finished without waiting for the old replica (%v)", err)
			return
		default:
		}
		var n int
		if err := db.QueryRow(q).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			time.Sleep(100 * time.Millisecond)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("the migration did not wait for the old replica's transaction")
}

// TestMigration0004UnderOldWriters: old replicas enqueue in a loop while
// the migration runs over a table of some thousands of rows. Every enqueue
// that committed is in the migrated schema.
func TestMigration0004UnderOldWriters(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.New(t, dialect)
			s := openV3Store(t, db)
			sdb := s.SQLDB()
			tx, err := sdb.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			const preexisting = 20_000
			for i := range preexisting {
				if err := insertV3(ctx, tx, dialect, fmt.Sprintf("old-%d", i)); err != nil {
					t.Fatal(err)
				}
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}

			writers := 8
			if dialect == "sqlite" {
				writers = 2
			}
			stop := liveWriters(t, writers, func(key string) bool { return insertV3(ctx, sdb, dialect, key) == nil })
			time.Sleep(50 * time.Millisecond)
			if err := s.Migrate(ctx); err != nil {
				t.Fatalf("migrate: %v", err)
			}
			time.Sleep(200 * time.Millisecond)
			committed := stop()

			n := requireNoLostEnqueues(t, ctx, sdb, "millpond_events", committed, "of the old replicas during the migration")
			if got := db.Count(t, "SELECT COUNT(*) FROM millpond_deliveries"); got != int64(preexisting+n) {
				t.Errorf("%d delivery rows, want %d", got, preexisting+n)
			}
		})
	}
}

// TestOldReplicaCannotWriteTheView: after migration 0004 a replica of the
// previous version still runs its statements against millpond_outbox, now
// a view. Every write must fail: on MariaDB an UPDATE of a join view's
// columns of one table went through, so an old replica claimed events
// (and ran their handlers) whose acknowledgement then failed on the view,
// and they were delivered again after the lease; its Nack rescheduled or
// dead-lettered them.
func TestOldReplicaCannotWriteTheView(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.New(t, dialect)
			s := db.Store(t)
			tx, commit, rollback := db.Begin(t)
			if _, err := s.Enqueue(ctx, tx, outbox.Event{Stream: "m4", Key: "k", Kind: "Placed", Payload: []byte("{}")}); err != nil {
				rollback()
				t.Fatal(err)
			}
			if err := commit(); err != nil {
				t.Fatal(err)
			}
			sdb := s.SQLDB()
			id := db.Count(t, "SELECT MIN(id) FROM millpond_deliveries")
			before := dumpOutbox(t, sdb, dialect)
			// The writes of the previous version's statements (claim,
			// claim of an exhausted row, acknowledgement, fail, extend,
			// release, requeue, purge), one column set each.
			for _, q := range []string{
				"UPDATE millpond_outbox SET status = 'processing', attempts = attempts + 1, claimed_by = 'old', available_at = 999, claim_key = 'ck' WHERE id = ?",
				"UPDATE millpond_outbox SET last_error = 'x', status = 'dead_letter', claimed_by = 'old', claim_key = '' WHERE id = ?",
				"UPDATE millpond_outbox SET status = 'delivered', delivered_at = 5 WHERE id = ?",
				"UPDATE millpond_outbox SET status = 'pending', available_at = 5, last_error = 'x' WHERE id = ?",
				"UPDATE millpond_outbox SET available_at = 12345 WHERE id = ?",
				"UPDATE millpond_outbox SET status = 'pending', attempts = 0, available_at = 1 WHERE id = ?",
				"UPDATE millpond_outbox SET status = 'pending', attempts = 0, available_at = 1, last_error = '' WHERE id = ?",
				"UPDATE millpond_outbox SET claimed_by = 'old' WHERE id = ?",
				"UPDATE millpond_outbox SET attempts = 7 WHERE id = ?",
				"UPDATE millpond_outbox SET payload = 'x' WHERE id = ?",
				"DELETE FROM millpond_outbox WHERE id = ?",
			} {
				if _, err := sdb.ExecContext(ctx, rebind(dialect, q), id); err == nil {
					t.Errorf("an old replica's %q went through the view", q)
				}
			}
			if err := insertV3(ctx, sdb, dialect, "old"); err == nil {
				t.Errorf("an old replica's enqueue went through the view")
			}
			compareDumps(t, "the view after the old replica's writes", dumpOutbox(t, sdb, dialect), before)
		})
	}
}

// TestMigration0004DownKeepsAnInFlightEnqueue: rolling back with the down
// step of 0004 (goose, golang-migrate) while a replica of the new version
// still enqueues. On PostgreSQL its transaction in flight is waited for
// and copied into the old table; a later one fails on the old layout.
func TestMigration0004DownKeepsAnInFlightEnqueue(t *testing.T) {
	ctx := context.Background()
	db := testdb.New(t, "postgres")
	s := db.Store(t)
	sdb := s.SQLDB()
	tx, commit, rollback := db.Begin(t)
	defer rollback()
	if _, err := s.Enqueue(ctx, tx, outbox.Event{Stream: "m4", Key: "in-flight", Kind: "Placed", Payload: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		fsys, err := outbox.MigrationsFS("postgres")
		if err != nil {
			done <- err
			return
		}
		body, err := fs.ReadFile(fsys, "0004_shared_events.down.sql")
		if err != nil {
			done <- err
			return
		}
		_, err = sdb.ExecContext(ctx, string(body))
		done <- err
	}()
	waitForLockWait(t, sdb, "postgres", done)
	if err := commit(); err != nil {
		t.Logf("the new replica's commit failed: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("down: %v", err)
	}
	if n := db.Count(t, "SELECT COUNT(*) FROM millpond_outbox WHERE event_key = 'in-flight'"); n != 1 {
		t.Errorf("after the down step the old table has %d rows of the new replica's committed enqueue, want 1", n)
	}
}

// TestConcurrentUpgradeFromVersion3: the replicas of a new version start
// together on a version-3 schema with rows and each runs Migrate. Every
// replica succeeds, every row is kept and each step is recorded once.
func TestConcurrentUpgradeFromVersion3(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.New(t, dialect)
			s := openV3Store(t, db)
			writeVersion3(t, s.SQLDB(), dialect, v4Rows())
			want := dumpOutbox(t, s.SQLDB(), dialect)
			stores := make([]*outbox.Store, 4)
			for i := range stores {
				r, err := anydb.Open(ctx, db.URL, outbox.WithoutListen())
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { r.Close() })
				stores[i] = r
			}
			start := make(chan struct{})
			var wg sync.WaitGroup
			errs := make([]error, len(stores))
			for i, r := range stores {
				wg.Go(func() {
					<-start
					errs[i] = r.Migrate(ctx)
				})
			}
			close(start)
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Errorf("replica %d: Migrate: %v", i, err)
				}
			}
			if err := stores[0].CheckSchema(ctx); err != nil {
				t.Errorf("schema after the replicas' migrations: %v", err)
			}
			compareDumps(t, "the view after the concurrent upgrade", dumpOutbox(t, s.SQLDB(), dialect), want)
			if n, distinct := db.Count(t, "SELECT COUNT(*) FROM millpond_schema_migrations"), db.Count(t, "SELECT COUNT(DISTINCT version) FROM millpond_schema_migrations"); n != distinct {
				t.Errorf("%d migration records for %d versions", n, distinct)
			}
		})
	}
}

// TestMigration0004KilledMidCopy: the replica running migration 0004 dies
// while it copies (its connection killed from another one). Run again, the
// migration completes with every row. MariaDB has committed the rename and
// part of the copy; PostgreSQL has rolled the step back.
func TestMigration0004KilledMidCopy(t *testing.T) {
	cases := []struct{ dialect, statement string }{
		{"mysql", "INSERT INTO millpond_events"},
		{"mysql", "INSERT INTO millpond_deliveries"},
		{"postgres", "stored once (millpond_events)"}, // the head of the step: pg_stat_activity keeps 1 kB
	}
	for _, c := range cases {
		t.Run(c.dialect+"-"+strings.Trim(strings.Fields(c.statement)[len(strings.Fields(c.statement))-1], "()"), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.New(t, c.dialect)
			s := openV3Store(t, db)
			sdb := s.SQLDB()
			tx, err := sdb.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			for i := range 20_000 {
				if err := insertV3(ctx, tx, c.dialect, fmt.Sprintf("old-%d", i)); err != nil {
					t.Fatal(err)
				}
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			writeVersion3(t, sdb, c.dialect, v4Rows())
			want := dumpOutbox(t, sdb, c.dialect)

			done := make(chan error, 1)
			go func() { done <- s.Migrate(ctx) }()
			find := map[string]string{
				"mysql":    "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = DATABASE() AND ID <> CONNECTION_ID() AND INFO LIKE ?",
				"postgres": "SELECT pid FROM pg_stat_activity WHERE application_name = current_setting('application_name') AND pid <> pg_backend_pid() AND backend_type = 'client backend' AND query LIKE $1",
			}[c.dialect]
			kill := map[string]string{"mysql": "KILL CONNECTION ?", "postgres": "SELECT pg_terminate_backend($1)"}[c.dialect]
			killed := false
			for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && !killed; {
				var id int64
				err := sdb.QueryRowContext(ctx, find, "%"+c.statement+"%").Scan(&id)
				if err == sql.ErrNoRows {
					time.Sleep(time.Millisecond)
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				if _, err := sdb.ExecContext(ctx, kill, id); err != nil {
					t.Fatal(err)
				}
				killed = true
			}
			if !killed {
				t.Fatalf("never saw the migration run %q", c.statement)
			}
			if err := <-done; err == nil {
				t.Fatalf("the killed migration reported success")
			} else {
				t.Logf("killed migration: %v", err)
			}
			if err := s.Migrate(ctx); err != nil {
				t.Fatalf("migrate again: %v", err)
			}
			compareDumps(t, "the view after the re-run", dumpOutbox(t, sdb, c.dialect), want)
		})
	}
}

// TestMigration0004DownUnderNewWriters: rolling back on MariaDB with the
// down steps (goose, golang-migrate) while replicas of the new version
// still enqueue. Every enqueue they committed is in the rebuilt table.
func TestMigration0004DownUnderNewWriters(t *testing.T) {
	ctx := context.Background()
	db := testdb.New(t, "mysql")
	s := db.Store(t)
	tx, commit, rollback := db.Begin(t)
	for i := range 20_000 {
		if _, err := s.Enqueue(ctx, tx, outbox.Event{Stream: "m4", Key: fmt.Sprintf("old-%d", i), Kind: "Placed", Payload: []byte("{}")}); err != nil {
			rollback()
			t.Fatal(err)
		}
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}
	stop := liveWriters(t, 8, func(key string) bool {
		tx, commit, rollback, err := db.TryBegin()
		if err != nil {
			return false
		}
		if _, err := s.Enqueue(ctx, tx, outbox.Event{Stream: "m4", Key: key, Kind: "Placed", Payload: []byte("{}")}); err != nil {
			rollback()
			return false
		}
		return commit() == nil
	})
	time.Sleep(50 * time.Millisecond)
	sdb := s.SQLDB()
	for _, name := range []string{"0007_claim_keeps_index.down.sql", "0005_status_off_indexes.down.sql", "0004_shared_events.down.sql"} {
		execInOneSession(t, sdb, name, mysqlStatements(t, name))
	}
	time.Sleep(200 * time.Millisecond)
	committed := stop()
	requireNoLostEnqueues(t, ctx, sdb, "millpond_outbox", committed, "of the new replicas during the down steps")
}

// liveWriters runs n goroutines that write fresh "live-N" keys with write
// until stopped, recording the keys whose write reports a commit. stop ends
// them and returns those keys. It also runs when the test ends, so a test
// that fails before calling it leaves no writer looping against the
// database (one that did so kept MariaDB busy, and the rest of the package
// slow, until go test's timeout).
func liveWriters(t *testing.T, n int, write func(key string) bool) (stop func() *sync.Map) {
	var committed sync.Map
	var stopped atomic.Bool
	var wg sync.WaitGroup
	var seq atomic.Int64
	for range n {
		wg.Go(func() {
			for !stopped.Load() {
				key := fmt.Sprintf("live-%d", seq.Add(1))
				if write(key) {
					committed.Store(key, true)
				}
			}
		})
	}
	stop = func() *sync.Map {
		stopped.Store(true)
		wg.Wait()
		return &committed
	}
	t.Cleanup(func() { stop() })
	return stop
}

// lostEnqueues counts the keys in committed (the "live-" enqueues that
// writers saw commit) and those of them table does not hold.
func lostEnqueues(t *testing.T, ctx context.Context, sdb *sql.DB, table string, committed *sync.Map) (n, lost int) {
	t.Helper()
	have := map[string]bool{}
	rows, err := sdb.QueryContext(ctx, "SELECT event_key FROM "+table+" WHERE event_key LIKE 'live-%'")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		have[k] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	committed.Range(func(k, _ any) bool {
		n++
		if !have[k.(string)] {
			lost++
		}
		return true
	})
	return n, lost
}

// requireNoLostEnqueues fails the test when an enqueue in committed (made
// by the writers named in what) is missing from table, and returns how
// many there were.
func requireNoLostEnqueues(t *testing.T, ctx context.Context, sdb *sql.DB, table string, committed *sync.Map, what string) int {
	t.Helper()
	n, lost := lostEnqueues(t, ctx, sdb, table, committed)
	t.Logf("%d enqueues committed %s", n, what)
	if lost > 0 {
		t.Errorf("%d of the %d enqueues committed %s are not in %s", lost, n, what, table)
	}
	return n
}
