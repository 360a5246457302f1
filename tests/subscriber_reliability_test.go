package tests

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"

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
//
// The dialects run one after the other, not in parallel with each other: a
// lease of 1 s leaves little room for a machine that is busy elsewhere. On
// MySQL the events are inserted in bulk (an enqueue there is two statements
// and 20,000 of them take a minute on a busy machine).
func TestAcksAndLeaseExtensionsDoNotDeadlock(t *testing.T) {
	t.Parallel()
	for _, dialect := range []string{"postgres", "mysql"} {
		t.Run(dialect, func(t *testing.T) {
			const n = 20000
			const stream = "overlap" // not a word the test looks for in the logs
			logs := &logLines{}
			db := testdb.New(t, dialect)
			store := db.Store(t, outbox.WithLogger(logs.slog()))
			start := time.Now()
			if dialect == "mysql" {
				insertMySQLEvents(t, db, stream, "ev", n)
			} else {
				enqueueMany(t, db, store, stream, "ev", n)
			}
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
			got := countDeliveries(msgs, 8, n, 0)
			select {
			case <-got.all:
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
			got.readers.Wait()
			deliveries, duplicates := got.result()
			delivered := db.Count(t, "SELECT COUNT(*) FROM millpond_outbox WHERE status = 'delivered'")
			retried := db.Count(t, "SELECT COUNT(*) FROM millpond_outbox WHERE attempts > 1")
			deadlocks := logs.matching("deadlock")
			t.Logf("%s: %d events enqueued in %s, handled in %s; %d distinct delivered, %d duplicate deliveries, %d rows delivered, %d rows claimed more than once, %d log lines naming a deadlock",
				dialect, n, enqueued.Round(time.Millisecond), handled.Round(time.Millisecond), len(deliveries), duplicates, delivered, retried, len(deadlocks))
			if warnings := logs.matching("lost their leases", "could not", "failed", "retrying"); len(warnings) > 0 {
				t.Logf("%d other warnings:%s", len(warnings), quote(warnings[:min(len(warnings), 8)]))
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

// insertMySQLEvents inserts n pending events of the default group keyed
// prefix-0 ... in multi-row INSERTs of 1,000, each event as Store.Enqueue
// would write it (the content hash is SHA-256 of kind, a zero byte and
// payload), then their delivery rows in one INSERT ... SELECT.
func insertMySQLEvents(t *testing.T, db *testdb.Database, stream, prefix string, n int) {
	t.Helper()
	const chunk = 1000
	const kind = "Reliability"
	for start := 0; start < n; start += chunk {
		var b strings.Builder
		b.WriteString("INSERT INTO millpond_events (stream, event_key, event_kind, payload, metadata, content_hash, created_at) VALUES ")
		var args []any
		now := time.Now().UnixMicro()
		for i := start; i < min(start+chunk, n); i++ {
			if i > start {
				b.WriteString(", ")
			}
			b.WriteString("(?, ?, ?, ?, '{}', ?, ?)")
			payload := []byte(strconv.Itoa(i))
			hash := sha256.Sum256(append([]byte(kind+"\x00"), payload...))
			args = append(args, stream, prefix+"-"+strconv.Itoa(i), kind, payload, hash[:], now)
		}
		if _, err := db.SQL.Exec(b.String(), args...); err != nil {
			t.Fatalf("insert events %d-: %v", start, err)
		}
	}
	// One delivery row per event, for the default group, in event order.
	if _, err := db.SQL.Exec(`INSERT INTO millpond_deliveries (event_id, stream, consumer_group, status, available_at)
SELECT e.id, e.stream, '', 'pending', e.created_at FROM millpond_events e
WHERE e.stream = ? AND e.event_key LIKE ? AND NOT EXISTS (SELECT 1 FROM millpond_deliveries d WHERE d.event_id = e.id)
ORDER BY e.id`, stream, prefix+"-%"); err != nil {
		t.Fatalf("insert delivery rows: %v", err)
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
				poolTx       *pgxpool.Tx
				sqlTx        *sql.Tx
				asPgxTx      pgx.Tx = poolTx
				nilWatermill wsql.Tx
			)
			// Pools and connections cannot become an outbox.Tx at all
			// (TestTransactionsAreTypedAtCompileTime).
			nils := map[string]outbox.Tx{
				"the zero Tx": {}, "PgxTx(nil *pgxpool.Tx)": outbox.PgxTx(poolTx),
				"PgxTx(pgx.Tx holding a nil *pgxpool.Tx)": outbox.PgxTx(asPgxTx), "SQLTx(nil *sql.Tx)": outbox.SQLTx(sqlTx),
				"WatermillSQLTx(nil)": outbox.WatermillSQLTx(nilWatermill),
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

// execTx runs a statement with ? placeholders in tx (pgx.Tx or *sql.Tx).
func execTx(tx any, query string, args ...any) error {
	switch tx := tx.(type) {
	case pgx.Tx:
		n := 0
		var b strings.Builder
		for _, r := range query {
			if r == '?' {
				n++
				fmt.Fprintf(&b, "$%d", n)
				continue
			}
			b.WriteRune(r)
		}
		_, err := tx.Exec(context.Background(), b.String(), args...)
		return err
	case *sql.Tx:
		_, err := tx.Exec(query, args...)
		return err
	}
	return fmt.Errorf("unexpected transaction %T", tx)
}

// falseAlarms are the Subscriber's log lines about acknowledgements or
// leases that went wrong.
var falseAlarms = []string{"lost their leases", "whose lease was lost", "could not", "delivered again"}

// TestAcknowledgingInTheHandlersTransactionIsNotAckedAgain: events
// acknowledged inside the handler's own transaction, half through
// AcknowledgeMessageInTx and half through ReceiptFromContext +
// AcknowledgeInTx, are delivered once, acknowledged once, and the
// Subscriber logs no stale acknowledgement and no lost lease about them,
// although its lease extender runs (lease 2 s, an extension every 667 ms)
// while handlers hold transactions open and while committed events wait
// for their Ack.
func TestAcknowledgingInTheHandlersTransactionIsNotAckedAgain(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			const n = 240
			const lease = 2 * time.Second
			const stream = "in-tx"
			logs := &logLines{}
			db := testdb.New(t, dialect)
			store := db.Store(t, outbox.WithLogger(logs.slog()))
			db.Exec(t, "CREATE TABLE effects (event_key VARCHAR(64) NOT NULL PRIMARY KEY)")
			enqueueMany(t, db, store, stream, "ev", n)
			_, msgs := subscribe(t, store, outbox.SubscriberConfig{
				Lease: lease, MaxInFlight: 8, BatchSize: 40, Logger: logs.watermill(),
			}, stream)
			hold := 20 * time.Millisecond
			if dialect == "sqlite" {
				hold = 5 * time.Millisecond // one writer: every open transaction stalls the rest
			}
			var mu sync.Mutex
			deliveries := map[string]int{}
			var failures []error
			var handlers sync.WaitGroup
			for range 8 {
				handlers.Add(1)
				go func() {
					defer handlers.Done()
					for msg := range msgs {
						err := func() error {
							mu.Lock()
							deliveries[msg.UUID]++
							i := len(deliveries)
							mu.Unlock()
							raw, commit, rollback, err := db.TryBeginRaw()
							if err != nil {
								return err
							}
							defer rollback()
							if err := execTx(raw, "INSERT INTO effects (event_key) VALUES (?)", msg.UUID); err != nil {
								return err
							}
							tx := testdb.Wrap(raw)
							if i%2 == 0 {
								err = store.AcknowledgeMessageInTx(msg.Context(), tx, msg)
							} else {
								r, ok := outbox.ReceiptFromContext(msg.Context())
								if !ok {
									return errors.New("no receipt")
								}
								err = store.AcknowledgeInTx(msg.Context(), tx, r)
							}
							if err != nil {
								return err
							}
							time.Sleep(hold) // the transaction stays open
							if err := commit(); err != nil {
								return err
							}
							time.Sleep(hold) // committed, not yet acked
							return nil
						}()
						if err != nil {
							mu.Lock()
							failures = append(failures, fmt.Errorf("%s: %w", msg.UUID, err))
							mu.Unlock()
							msg.Nack()
							continue
						}
						msg.Ack()
					}
				}()
			}
			waitForCount(t, db, "SELECT COUNT(*) FROM millpond_outbox WHERE status = 'delivered'", n)
			time.Sleep(lease + 200*time.Millisecond) // a lost event would come back
			mu.Lock()
			defer mu.Unlock()
			if len(failures) > 0 {
				t.Fatalf("%d handler failures, first: %v", len(failures), failures[0])
			}
			duplicates := 0
			for _, c := range deliveries {
				duplicates += c - 1
			}
			effects := db.Count(t, "SELECT COUNT(*) FROM effects")
			alarms := logs.matching(falseAlarms...)
			t.Logf("%s: %d events, %d deliveries, %d effects, %d false alarms in the logs", dialect, n, len(deliveries)+duplicates, effects, len(alarms))
			if len(deliveries) != n || duplicates > 0 || effects != n {
				t.Errorf("%d events delivered, %d more than once, %d effects; want %d, 0, %d", len(deliveries), duplicates, effects, n, n)
			}
			if len(alarms) > 0 {
				t.Errorf("%d log lines report lost leases or stale acks of events acknowledged in the handler's transaction:%s", len(alarms), quote(alarms[:min(5, len(alarms))]))
			}
		})
	}
}

// TestALostLeaseIsStillReported: when a held event's lease really is lost
// (it expired and another worker claimed the event), the Subscriber still
// says so: its lease extender reports the held event lost, a late Ack is
// reported as stale, and an acknowledgement in the handler's transaction
// fails with ErrStaleClaim and its Nack is reported.
func TestALostLeaseIsStillReported(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			const stream = "lost"
			logs := &logLines{}
			db := testdb.New(t, dialect)
			store := db.Store(t)
			enqueueMany(t, db, store, stream, "ev", 2)
			_, msgs := subscribe(t, store, outbox.SubscriberConfig{Lease: time.Second, MaxInFlight: 2, Logger: logs.watermill()}, stream)
			first, second := receive(t, msgs, 10*time.Second), receive(t, msgs, 10*time.Second)
			// Another worker holds both events now, under its own claim key and
			// lease, as if their leases had expired and it had claimed them (one
			// statement, so the subscriber's own claimer cannot take them first).
			steal := "UPDATE millpond_deliveries SET claimed_by = 'thief', claim_key = '0123456789abcdef0123456789abcdef', available_at = ?"
			if dialect == "postgres" {
				steal = strings.Replace(steal, "?", "$1", 1)
			}
			db.Exec(t, steal, time.Now().Add(time.Hour).UnixMicro())
			expectLine := func(what string, words ...string) {
				t.Helper()
				deadline := time.Now().Add(10 * time.Second)
				for len(logs.matching(words...)) == 0 {
					if time.Now().After(deadline) {
						t.Fatalf("no log line says %s; the log:%s", what, quote(logs.matching("")))
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
			expectLine("that held events lost their leases", "held events lost their leases")

			first.Ack()
			expectLine("that an acked event had lost its lease", "Acked events had lost their leases")

			tx, _, rollback := db.Begin(t)
			err := store.AcknowledgeMessageInTx(context.Background(), tx, second)
			rollback()
			if !errors.Is(err, outbox.ErrStaleClaim) {
				t.Fatalf("acknowledging a lost event in a transaction: %v, want ErrStaleClaim", err)
			}
			second.Nack()
			expectLine("that a nacked event had lost its lease", "Nack of an event whose lease was lost")
		})
	}
}

// TestAcksAreWrittenPromptly measures, on every database, how long after a
// handler's Ack its acknowledgement is written, which bounds what a crash
// (SIGKILL, power loss) delivers again: handled events whose acks were not
// written yet. Each row's delivered_at is the database clock when the ack
// statement ran (the same host clock as the test's); the ack time is taken
// just before Ack. Handlers are quick (1 ms) and 16 run at once, so acks
// arrive much faster than one statement writes them. The number of handled
// events without a written ack must stay within
// 2*(BatchSize+MaxInFlight)+MaxInFlight; the time bounds are generous, as
// the machine that runs the tests is shared and slow.
func TestAcksAreWrittenPromptly(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			const n = 2000
			const stream = "prompt"
			cfg := outbox.SubscriberConfig{BatchSize: 100, MaxInFlight: 16}
			db := testdb.New(t, dialect)
			store := db.Store(t)
			enqueueMany(t, db, store, stream, "ev", n)

			_, msgs := subscribe(t, store, cfg, stream)
			var mu sync.Mutex
			acked := map[int64]time.Time{}
			for range cfg.MaxInFlight {
				go func() {
					for msg := range msgs {
						time.Sleep(time.Millisecond) // the handler's work
						id, _ := strconv.ParseInt(msg.Metadata.Get(outbox.MetadataEventID), 10, 64)
						mu.Lock()
						acked[id] = time.Now()
						mu.Unlock()
						msg.Ack()
					}
				}()
			}
			waitForCount(t, db, "SELECT COUNT(*) FROM millpond_outbox WHERE status = 'delivered'", n)

			written := map[int64]time.Time{}
			rows := int64Rows(t, db, "SELECT id, delivered_at FROM millpond_outbox WHERE status = 'delivered'")
			for _, r := range rows {
				written[r[0]] = time.UnixMicro(r[1])
			}
			mu.Lock()
			defer mu.Unlock()
			type edge struct {
				at    time.Time
				delta int // +1 an ack, -1 its write
			}
			var latencies []time.Duration
			var edges []edge
			for id, at := range acked {
				w, ok := written[id]
				if !ok {
					t.Fatalf("event %d acked but not delivered", id)
				}
				latencies = append(latencies, max(w.Sub(at), 0))
				edges = append(edges, edge{at, +1}, edge{w, -1})
			}
			slices.SortFunc(edges, func(a, b edge) int { return a.at.Compare(b.at) })
			backlog, worstBacklog := 0, 0
			for _, e := range edges {
				backlog += e.delta
				worstBacklog = max(worstBacklog, backlog)
			}
			slices.Sort(latencies)
			p50, p99, worst := latencies[len(latencies)/2], latencies[len(latencies)*99/100], latencies[len(latencies)-1]
			bound := 2*(cfg.BatchSize+cfg.MaxInFlight) + cfg.MaxInFlight
			t.Logf("%s: %d acks; from Ack to its ack statement: median %s, p99 %s, max %s; at most %d handled events without a written ack (bound %d)",
				dialect, len(acked), p50.Round(10*time.Microsecond), p99.Round(10*time.Microsecond), worst.Round(10*time.Microsecond), worstBacklog, bound)
			// The backlog is the guarantee; times depend on the machine (SQLite
			// waits for an fsync and sleeps while another writer holds the
			// database): a median of a few milliseconds, the bounds loose.
			if p50 > 50*time.Millisecond || p99 > time.Second {
				t.Errorf("acks are written late: median %s (bound 50ms), p99 %s (bound 1s)", p50, p99)
			}
			if worstBacklog > bound {
				t.Errorf("%d handled events had no written ack at one time; the bound is 2*(BatchSize+MaxInFlight)+MaxInFlight = %d", worstBacklog, bound)
			}
		})
	}
}

// int64Rows returns the rows of a query whose columns are all integers.
func int64Rows(t *testing.T, db *testdb.Database, query string) [][]int64 {
	t.Helper()
	var out [][]int64
	add := func(next func() bool, scan func(...any) error, cols int) {
		for next() {
			row := make([]int64, cols)
			dest := make([]any, cols)
			for i := range row {
				dest[i] = &row[i]
			}
			if err := scan(dest...); err != nil {
				t.Fatal(err)
			}
			out = append(out, row)
		}
	}
	if db.Pool != nil {
		rows, err := db.Pool.Query(context.Background(), query)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		add(rows.Next, rows.Scan, len(rows.FieldDescriptions()))
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	rows, err := db.SQL.Query(query)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		t.Fatal(err)
	}
	add(rows.Next, rows.Scan, len(cols))
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// deliveryCounter counts the deliveries of a subscription's messages by
// UUID, read and acknowledged by several goroutines.
type deliveryCounter struct {
	mu      sync.Mutex
	seen    map[string]int
	all     chan struct{}  // closed when n distinct messages were seen
	readers sync.WaitGroup // the readers, done when the channel closed
}

// countDeliveries starts readers goroutines that take msgs, wait pause,
// count each message and acknowledge it.
func countDeliveries(msgs <-chan *message.Message, readers, n int, pause time.Duration) *deliveryCounter {
	c := &deliveryCounter{seen: map[string]int{}, all: make(chan struct{})}
	for range readers {
		c.readers.Add(1)
		go func() {
			defer c.readers.Done()
			for msg := range msgs {
				time.Sleep(pause)
				c.mu.Lock()
				c.seen[msg.UUID]++
				if len(c.seen) == n && c.seen[msg.UUID] == 1 {
					close(c.all)
				}
				c.mu.Unlock()
				msg.Ack()
			}
		}()
	}
	return c
}

// result is the deliveries by UUID and how many were repeats. The map is a
// copy: the readers may still be counting.
func (c *deliveryCounter) result() (map[string]int, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	duplicates := 0
	for _, n := range c.seen {
		duplicates += n - 1
	}
	return maps.Clone(c.seen), duplicates
}
