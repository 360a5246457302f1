package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// enqueueMany enqueues n events keyed prefix-0 ... through the Store, in
// transactions of 500, four at a time.
func enqueueMany(t *testing.T, db *testdb.Database, store *outbox.Store, stream, prefix string, n int) {
	t.Helper()
	const chunk = 500
	starts := make(chan int)
	errs := make(chan error, 4)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for start := range starts {
				tx, commit, rollback, err := db.TryBegin()
				if err != nil {
					errs <- err
					return
				}
				for i := start; i < min(start+chunk, n); i++ {
					ev := outbox.Event{Stream: stream, Key: prefix + "-" + strconv.Itoa(i), Kind: "Reliability", Payload: []byte(strconv.Itoa(i))}
					if _, err = store.Enqueue(context.Background(), tx, ev); err != nil {
						break
					}
				}
				if err == nil {
					err = commit()
				}
				if err != nil {
					rollback()
					errs <- fmt.Errorf("enqueue from %d: %w", start, err)
					return
				}
			}
		}()
	}
	go func() {
		defer close(starts)
		for start := 0; start < n; start += chunk {
			select {
			case starts <- start:
			case err := <-errs:
				errs <- err
				return
			}
		}
	}()
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
}

// TestAcksAndLeaseExtensionsDoNotDeadlock is the reproduction of a deadlock
// between the Subscriber's acknowledger and its lease extender, which both
// lock many outbox rows at once: one process, lease 1 s (an extension every
// 333 ms of up to 1,064 held events), batches of 1,000, 64 in flight,
// 20,000 events. Every event must be delivered exactly once, and nothing may
// log a deadlock, not even one retried successfully (the Store logs every
// retried deadlock).
func TestAcksAndLeaseExtensionsDoNotDeadlock(t *testing.T) {
	for _, dialect := range []string{"postgres", "mysql"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			const n = 20000
			const stream = "deadlock"
			logs := &logLines{}
			db := testdb.New(t, dialect)
			store := db.Store(t, outbox.WithLogger(logs.slog()))
			start := time.Now()
			enqueueMany(t, db, store, stream, "ev", n)
			enqueued := time.Since(start)

			sub, err := outbox.NewSubscriber(store, outbox.SubscriberConfig{
				Lease: time.Second, BatchSize: 1000, MaxInFlight: 64, PollInterval: 20 * time.Millisecond,
				Logger: logs.watermill(),
			})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			msgs, err := sub.Subscribe(ctx, stream)
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			deliveries := map[string]int{}
			all := make(chan struct{})
			var readers sync.WaitGroup
			for range 8 {
				readers.Add(1)
				go func() {
					defer readers.Done()
					for msg := range msgs {
						mu.Lock()
						deliveries[msg.UUID]++
						if len(deliveries) == n && deliveries[msg.UUID] == 1 {
							close(all)
						}
						mu.Unlock()
						msg.Ack()
					}
				}()
			}
			select {
			case <-all:
			case <-time.After(90 * time.Second):
				t.Errorf("not every event was delivered within 90 s")
			}
			handled := time.Since(start) - enqueued
			// Wait for the acks to land, then longer than a lease, so that a
			// dropped ack would show as a second delivery.
			deadline := time.Now().Add(30 * time.Second)
			for db.Count(t, "SELECT COUNT(*) FROM millpond_outbox WHERE status = 'delivered'") < n && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			time.Sleep(1500 * time.Millisecond)
			if err := sub.Close(); err != nil {
				t.Fatal(err)
			}
			readers.Wait()

			mu.Lock()
			defer mu.Unlock()
			duplicates := 0
			for _, c := range deliveries {
				duplicates += c - 1
			}
			delivered := db.Count(t, "SELECT COUNT(*) FROM millpond_outbox WHERE status = 'delivered'")
			retried := db.Count(t, "SELECT COUNT(*) FROM millpond_outbox WHERE attempts > 1")
			deadlocks := logs.matching("deadlock")
			t.Logf("%s: %d events enqueued in %s, handled in %s; %d distinct delivered, %d duplicate deliveries, %d rows delivered, %d rows claimed more than once, %d log lines naming a deadlock",
				dialect, n, enqueued.Round(time.Millisecond), handled.Round(time.Millisecond), len(deliveries), duplicates, delivered, retried, len(deadlocks))
			if warnings := logs.matching("lost their leases", "could not", "failed"); len(warnings) > 0 {
				t.Logf("%d other warnings, first: %s", len(warnings), warnings[0])
			}
			if len(deadlocks) > 0 {
				t.Errorf("%d log lines name a deadlock; first: %s", len(deadlocks), deadlocks[0])
			}
			if duplicates > 0 || len(deliveries) != n || delivered != n {
				t.Errorf("%d distinct events delivered with %d duplicate deliveries and %d rows delivered; want %d, 0, %d", len(deliveries), duplicates, delivered, n, n)
			}
		})
	}
}

// quote makes a list of lines readable in a failure message.
func quote(lines []string) string {
	return "\n\t" + strings.Join(lines, "\n\t")
}

// TestTypedNilTransactionsAreRefused: a nil transaction of a concrete type
// (var tx *pgxpool.Tx) is refused with ErrNoTransaction by every entry point
// that takes a transaction, never dereferenced.
func TestTypedNilTransactionsAreRefused(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.New(t, dialect)
			store := db.Store(t)
			var (
				poolTx   *pgxpool.Tx
				sqlTx    *sql.Tx
				conn     *pgx.Conn
				pool     *pgxpool.Pool
				sqlDB    *sql.DB
				sqlConn  *sql.Conn
				wsqlTx   *notATransaction
				asPgxTx  pgx.Tx = poolTx
				anything any    = poolTx
			)
			nils := map[string]any{
				"*pgxpool.Tx": poolTx, "pgx.Tx holding a nil *pgxpool.Tx": asPgxTx, "*sql.Tx": sqlTx,
				"*pgx.Conn": conn, "*pgxpool.Pool": pool, "*sql.DB": sqlDB, "*sql.Conn": sqlConn,
				"other pointer": wsqlTx, "any holding a nil *pgxpool.Tx": anything,
			}
			ev := outbox.Event{Stream: "nil-tx", Key: "k", Kind: "K", Payload: []byte("{}")}
			for name, tx := range nils {
				if _, err := store.Enqueue(ctx, tx, ev); !errors.Is(err, outbox.ErrNoTransaction) {
					t.Errorf("Enqueue with a nil %s: %v, want ErrNoTransaction", name, err)
				}
				if _, err := outbox.NewPublisher(store, tx); !errors.Is(err, outbox.ErrNoTransaction) {
					t.Errorf("NewPublisher with a nil %s: %v, want ErrNoTransaction", name, err)
				}
				pub, err := outbox.NewContextPublisher(store)
				if err != nil {
					t.Fatal(err)
				}
				msg := message.NewMessage(watermill.NewUUID(), []byte("{}"))
				msg.SetContext(outbox.ContextWithTx(ctx, tx))
				if err := pub.Publish("nil-tx", msg); !errors.Is(err, outbox.ErrNoTransaction) {
					t.Errorf("Publish with a nil %s in the context: %v, want ErrNoTransaction", name, err)
				}
			}

			// The acknowledgements in a transaction, with a real delivery.
			tx, commit, _ := db.Begin(t)
			if _, err := store.Enqueue(ctx, tx, ev); err != nil {
				t.Fatal(err)
			}
			if err := commit(); err != nil {
				t.Fatal(err)
			}
			_, msgs := subscribe(t, store, outbox.SubscriberConfig{}, "nil-tx")
			msg := receive(t, msgs, 10*time.Second)
			receipt, ok := outbox.ReceiptFromContext(msg.Context())
			if !ok {
				t.Fatal("no receipt in the message context")
			}
			for name, tx := range nils {
				if err := store.AcknowledgeInTx(ctx, tx, receipt); !errors.Is(err, outbox.ErrNoTransaction) {
					t.Errorf("AcknowledgeInTx with a nil %s: %v, want ErrNoTransaction", name, err)
				}
				if err := store.AcknowledgeMessageInTx(ctx, tx, msg); !errors.Is(err, outbox.ErrNoTransaction) {
					t.Errorf("AcknowledgeMessageInTx with a nil %s: %v, want ErrNoTransaction", name, err)
				}
			}
			msg.Ack()
			waitForCount(t, db, "SELECT COUNT(*) FROM millpond_outbox WHERE status = 'delivered'", 1)
		})
	}
}
