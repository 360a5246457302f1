package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/outbox/sqlite"
)

// conflictCounter counts the store's "lock conflict; retrying" warnings.
type conflictCounter struct{ n atomic.Int64 }

func (c *conflictCounter) Enabled(context.Context, slog.Level) bool { return true }
func (c *conflictCounter) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "lock conflict") {
		c.n.Add(1)
	}
	return nil
}
func (c *conflictCounter) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *conflictCounter) WithGroup(string) slog.Handler      { return c }

// TestStoreWritesQueueInProcess: the store's own statements on one SQLite
// database take turns in the process instead of meeting in SQLite's busy
// handler. With the busy timeout at 0 any two of them that met there would
// fail at once with "database is locked" (retried and logged as a lock
// conflict); eight workers claiming, failing, extending and acknowledging
// while two others read Stats must see none, and deliver every event once.
func TestStoreWritesQueueInProcess(t *testing.T) {
	ctx := context.Background()
	// sqlite.DSN's settings, but no busy timeout.
	dsn := "file:" + filepath.Join(t.TempDir(), "gate.db") + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(0)&_pragma=synchronous(FULL)&_txlock=immediate"
	db, err := sql.Open(sqlite.DriverName, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(12)
	conflicts := &conflictCounter{}
	store, err := sqlite.New(db, outbox.WithLogger(slog.New(conflicts)))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	const events = 600
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range events {
		ev := outbox.Event{Stream: "gate", Key: fmt.Sprintf("k%d", i), Kind: "K", Payload: []byte(`{}`)}
		if _, err := store.Enqueue(ctx, outbox.SQLTx(tx), ev); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}

	var (
		mu      sync.Mutex
		acked   = map[string]int{}
		wg      sync.WaitGroup
		errs    = make(chan error, 16)
		stop    = make(chan struct{})
		readers sync.WaitGroup
	)
	for range 2 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := store.Stats(ctx); err != nil {
					errs <- fmt.Errorf("stats: %w", err)
					return
				}
			}
		}()
	}
	deadline := time.Now().Add(time.Minute)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				got, err := store.Claim(ctx, outbox.ClaimRequest{Stream: "gate", Worker: fmt.Sprintf("w%d", w), Limit: 5, Lease: time.Minute, MaxAttempts: 5})
				if err != nil {
					errs <- fmt.Errorf("claim: %w", err)
					return
				}
				if len(got) == 0 {
					mu.Lock()
					done := len(acked) == events
					mu.Unlock()
					if done {
						return
					}
					continue
				}
				for i, c := range got {
					if i == 0 && c.Attempts == 1 {
						// Fail the first of each batch once, due at once.
						if _, err := store.Fail(ctx, c.Receipt(), outbox.Failure{Reason: "once", MaxAttempts: 5}); err != nil {
							errs <- fmt.Errorf("fail: %w", err)
							return
						}
						continue
					}
					if _, err := store.Extend(ctx, c.Receipt(), time.Minute); err != nil {
						errs <- fmt.Errorf("extend: %w", err)
						return
					}
					if err := store.Acknowledge(ctx, c.Receipt()); err != nil {
						errs <- fmt.Errorf("acknowledge: %w", err)
						return
					}
					mu.Lock()
					acked[c.Key]++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	readers.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if len(acked) != events {
		t.Fatalf("%d of %d events acknowledged", len(acked), events)
	}
	for k, n := range acked {
		if n != 1 {
			t.Fatalf("event %s acknowledged %d times", k, n)
		}
	}
	if n := conflicts.n.Load(); n != 0 {
		t.Fatalf("%d lock conflicts between the store's own statements; want 0", n)
	}
}

// noBusyTimeoutStore opens a store over a database with sqlite.DSN's
// settings but no busy timeout: any two writers that met in SQLite's busy
// handler would fail at once with "database is locked".
func noBusyTimeoutStore(t *testing.T, conflicts *conflictCounter) (*outbox.Store, *sql.DB) {
	t.Helper()
	dsn := "file:" + filepath.Join(t.TempDir(), "gate.db") + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(0)&_pragma=synchronous(FULL)&_txlock=immediate"
	db, err := sql.Open(sqlite.DriverName, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(12)
	store, err := sqlite.New(db, outbox.WithLogger(slog.New(conflicts)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("CREATE TABLE orders (id INTEGER PRIMARY KEY, note TEXT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	return store, db
}

// TestInTxTakesTurnsWithTheStore: the application's transactions begun
// with Store.InTx wait in the store's write queue, with the store's own
// claims and acknowledgements, instead of meeting them in SQLite's busy
// handler. With the busy timeout at 0, four producers writing an order and
// its event in each InTx while four workers claim and acknowledge must see
// no "database is locked", and every event is delivered once.
func TestInTxTakesTurnsWithTheStore(t *testing.T) {
	ctx := context.Background()
	conflicts := &conflictCounter{}
	store, db := noBusyTimeoutStore(t, conflicts)
	const producers, perProducer = 4, 60
	const events = producers * perProducer
	var (
		mu       sync.Mutex
		acked    = map[string]int{}
		wg       sync.WaitGroup
		errs     = make(chan error, 16)
		produced atomic.Int64
	)
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perProducer {
				err := store.InTx(ctx, nil, func(ctx context.Context, tx *sql.Tx) error {
					if _, err := tx.ExecContext(ctx, "INSERT INTO orders (note) VALUES (?)", "placed"); err != nil {
						return err
					}
					_, err := store.Enqueue(ctx, outbox.SQLTx(tx), outbox.Event{Stream: "intx", Key: fmt.Sprintf("p%d-%d", p, i), Kind: "K", Payload: []byte(`{}`)})
					return err
				})
				if err != nil {
					errs <- fmt.Errorf("producer: %w", err)
					return
				}
				produced.Add(1)
			}
		}()
	}
	deadline := time.Now().Add(time.Minute)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				got, err := store.Claim(ctx, outbox.ClaimRequest{Stream: "intx", Worker: fmt.Sprintf("w%d", w), Limit: 5, Lease: time.Minute, MaxAttempts: 5})
				if err != nil {
					errs <- fmt.Errorf("claim: %w", err)
					return
				}
				for _, c := range got {
					if err := store.Acknowledge(ctx, c.Receipt()); err != nil {
						errs <- fmt.Errorf("acknowledge: %w", err)
						return
					}
					mu.Lock()
					acked[c.Key]++
					mu.Unlock()
				}
				mu.Lock()
				done := len(acked) == events
				mu.Unlock()
				if done {
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	if len(acked) != events {
		t.Fatalf("%d of %d events acknowledged (%d produced)", len(acked), events, produced.Load())
	}
	for k, n := range acked {
		if n != 1 {
			t.Fatalf("event %s acknowledged %d times", k, n)
		}
	}
	var orders int
	if err := db.QueryRow("SELECT COUNT(*) FROM orders").Scan(&orders); err != nil {
		t.Fatal(err)
	}
	if orders != events {
		t.Fatalf("%d orders for %d events", orders, events)
	}
	if n := conflicts.n.Load(); n != 0 {
		t.Fatalf("%d lock conflicts between InTx and the store; want 0", n)
	}
}

// TestInTxTurnEndsWithIt: fn's context passes the write queue only while
// InTx runs. A call made with it afterwards (a goroutine fn left behind)
// waits for its turn like any other.
func TestInTxTurnEndsWithIt(t *testing.T) {
	ctx := context.Background()
	store, _ := noBusyTimeoutStore(t, &conflictCounter{})
	var leftover context.Context
	if err := store.InTx(ctx, nil, func(ctx context.Context, tx *sql.Tx) error {
		leftover = ctx
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	holding, release := make(chan struct{}), make(chan struct{})
	held := make(chan error, 1)
	go func() {
		held <- store.InTx(ctx, nil, func(ctx context.Context, tx *sql.Tx) error {
			close(holding)
			<-release
			return nil
		})
	}()
	<-holding
	done := make(chan error, 1)
	go func() {
		_, err := store.Stats(leftover)
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("a call with an ended InTx's context passed another InTx's turn (err %v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the call did not run after the turn was released")
	}
}
