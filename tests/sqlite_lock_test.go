package tests

import (
	"context"
	"database/sql"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/outbox/sqlite"
)

// holdSQLiteWriteLock opens another *sql.DB on the store's file (as another
// process would) and takes its write lock (BEGIN IMMEDIATE); the returned
// function lets it go.
func holdSQLiteWriteLock(t *testing.T, e *env) (release func()) {
	t.Helper()
	other, err := sql.Open(sqlite.DriverName, sqlite.DSN(strings.TrimPrefix(e.db.URL, "sqlite:")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	tx, err := other.BeginTx(context.Background(), nil) // BEGIN IMMEDIATE (see sqlite.DSN)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec("CREATE TABLE IF NOT EXISTS lock_holder (x INTEGER)"); err != nil {
		t.Fatal(err)
	}
	return func() { _ = tx.Rollback() }
}

// subscriptionGoroutines counts the goroutines running a Subscriber's code.
func subscriptionGoroutines() int {
	buf := make([]byte, 4<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "outbox.(*subscription)") {
			n++
		}
	}
	return n
}

// TestSQLiteSubscriberOutlastsAWriteLock: another process holds the SQLite
// file's write lock for longer than the store's busy timeout while a
// Subscriber delivers. Once the lock is gone every event is delivered,
// none twice though its ack was written; and a Subscriber closed while the
// lock is held returns within its statements' bounds and leaves no
// goroutine behind.
func TestSQLiteSubscriberOutlastsAWriteLock(t *testing.T) {
	t.Run("Recovers", func(t *testing.T) {
		e := newEnv(t, "sqlite", false)
		const n = 400
		enqueueMany(t, e.db, e.s, "locked", "ev", n)
		logs := &countingLogger{errors: map[string]int{}}
		_, msgs := subscribe(t, e.s, outbox.SubscriberConfig{MaxInFlight: 4, BatchSize: 50, Lease: 8 * time.Second, Logger: logs}, "locked")
		counter := countDeliveries(msgs, 4, n, 20*time.Millisecond)
		waitFor(t, "deliveries to start", func() bool { seen, _ := counter.result(); return len(seen) >= 50 })
		release := holdSQLiteWriteLock(t, e)
		time.Sleep(12 * time.Second) // longer than the busy timeout (10 s)
		release()
		select {
		case <-counter.all:
		case <-time.After(30 * time.Second):
		}
		seen, dups := counter.result()
		t.Logf("%d of %d events seen, %d duplicates; errors logged: %v", len(seen), n, dups, logs.errors)
		if len(seen) != n {
			t.Fatalf("%d of %d events delivered", len(seen), n)
		}
		waitFor(t, "every event delivered", func() bool {
			return e.count("SELECT COUNT(*) FROM millpond_deliveries WHERE stream = ? AND status = 'delivered'", "locked") == n
		})
		if dups > 0 && logs.errors["Could not record acks; the events will be delivered again after their leases expire"] == 0 {
			t.Fatalf("%d events delivered twice though every ack was written", dups)
		}
	})
	t.Run("ClosesWhileLocked", func(t *testing.T) {
		e := newEnv(t, "sqlite", false)
		const n = 200
		enqueueMany(t, e.db, e.s, "locked", "ev", n)
		before := subscriptionGoroutines()
		sub, err := outbox.NewSubscriber(e.s, outbox.SubscriberConfig{
			MaxInFlight: 4, BatchSize: 50, Lease: 8 * time.Second,
			CloseTimeout: 100 * time.Millisecond, PollInterval: 10 * time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		msgs, err := sub.Subscribe(context.Background(), "locked")
		if err != nil {
			t.Fatal(err)
		}
		for range 10 {
			(<-msgs).Ack()
		}
		<-msgs // handed out, never settled
		release := holdSQLiteWriteLock(t, e)
		defer release()
		(<-msgs).Ack() // its write waits for the lock
		took := within(t, 40*time.Second, "Subscriber.Close", func() { _ = sub.Close() })
		t.Logf("Close took %s with the write lock held", took)
		if limit := 2*5*time.Second + 3*time.Second; took > limit {
			t.Fatalf("Close took %s while another process held the write lock, want at most %s", took, limit)
		}
		deadline := time.Now().Add(5 * time.Second)
		for subscriptionGoroutines() > before && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if g := subscriptionGoroutines(); g > before {
			t.Fatalf("%d goroutines of the closed subscription still run", g-before)
		}
		release()
		// Nothing was lost: what was not acknowledged is delivered.
		e.db.Exec(t, "UPDATE millpond_deliveries SET available_at = 0 WHERE status = 'processing'")
		_, msgs2 := subscribe(t, e.s, outbox.SubscriberConfig{MaxInFlight: 4, BatchSize: 50}, "locked")
		undelivered := int(e.count("SELECT COUNT(*) FROM millpond_deliveries WHERE stream = ? AND status <> 'delivered'", "locked"))
		counter := countDeliveries(msgs2, 4, undelivered, 0)
		select {
		case <-counter.all:
		case <-time.After(30 * time.Second):
			seen, _ := counter.result()
			t.Fatalf("%d of %d undelivered events delivered after the lock went", len(seen), undelivered)
		}
		if undelivered < n-11 {
			t.Fatalf("%d events left undelivered, want at least %d", undelivered, n-11)
		}
	})
}
