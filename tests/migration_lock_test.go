package tests

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/outbox/anydb"
)

// TestConcurrentMigrateUnderRepeatableReadDefault: replicas starting
// together each run Migrate; on a PostgreSQL server whose default isolation
// is REPEATABLE READ, a replica that waited for the migration lock used to
// read a snapshot from before the winner committed, find nothing applied
// and fail running the first step again. Every replica must succeed.
func TestConcurrentMigrateUnderRepeatableReadDefault(t *testing.T) {
	ctx := context.Background()
	db := testdb.New(t, "postgres")
	stores := make([]*outbox.Store, 4)
	for i := range stores {
		s, err := anydb.Open(ctx, db.URL+"&default_transaction_isolation=repeatable%20read", outbox.WithoutListen())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		stores[i] = s
	}
	var wg sync.WaitGroup
	errs := make([]error, len(stores))
	for i, s := range stores {
		wg.Go(func() { errs[i] = s.Migrate(ctx) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("replica %d: Migrate: %v", i, err)
		}
	}
	if err := stores[0].CheckSchema(ctx); err != nil {
		t.Errorf("schema after the replicas' migrations: %v", err)
	}
}

// TestMySQLMigrationLockIsPerDatabase: MySQL's migration lock is a named
// lock, which is the server's. It used to be one name for every database,
// given up after 60 s: a long migration of another database on the server
// failed Migrate here. Now another database's migration does not hold this
// one up, and this database's is waited for as long as the context allows.
func TestMySQLMigrationLockIsPerDatabase(t *testing.T) {
	ctx := context.Background()
	other, mine := testdb.New(t, "mysql"), testdb.New(t, "mysql")
	s := mine.Store(t) // migrated: nothing left to do
	hold := func(db *testdb.Database) func() {
		conn, err := db.SQL.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var got int
		if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(CONCAT('millpond_migrate:', SHA1(DATABASE())), 5)").Scan(&got); err != nil || got != 1 {
			t.Fatalf("take the migration lock of %s: %d, %v", db.Name, got, err)
		}
		return func() {
			_, _ = conn.ExecContext(ctx, "SELECT RELEASE_LOCK(CONCAT('millpond_migrate:', SHA1(DATABASE())))")
			conn.Close()
		}
	}

	release := hold(other)
	start := time.Now()
	if err := s.Migrate(ctx); err != nil || time.Since(start) > 3*time.Second {
		t.Errorf("Migrate while another database migrates: %v after %s, want nil at once", err, time.Since(start))
	}
	release()

	release = hold(mine)
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := s.Migrate(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Migrate while this database migrates, for 1 s: %v, want context.DeadlineExceeded", err)
	}
	// Released after more than one 5 s wait of GET_LOCK: Migrate goes on.
	time.AfterFunc(6*time.Second, release)
	start = time.Now()
	if err := s.Migrate(ctx); err != nil || time.Since(start) < 6*time.Second {
		t.Errorf("Migrate while this database migrates for 6 s: %v after %s, want nil after the release", err, time.Since(start))
	}
}
