package tests

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// countingLogger counts the subscriber's error logs by message.
type countingLogger struct {
	watermill.NopLogger
	mu     sync.Mutex
	errors map[string]int
}

func (l *countingLogger) Error(msg string, _ error, _ watermill.LogFields) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errors[msg]++
}

func (l *countingLogger) With(watermill.LogFields) watermill.LoggerAdapter { return l }

// TestSubscriberSurvivesTerminatedConnections: while the Subscriber's own
// PostgreSQL connections are terminated over and over (pg_terminate_backend,
// as a failover or an administrator does), every event is still delivered
// and acknowledged, and an event whose ack was written is not delivered
// again.
func TestSubscriberSurvivesTerminatedConnections(t *testing.T) {
	for _, ordered := range []bool{false, true} {
		t.Run("ordered="+strconv.FormatBool(ordered), func(t *testing.T) {
			e := newEnv(t, "postgres", false)
			admin, err := pgx.Connect(context.Background(), testdb.PostgresURL())
			if err != nil {
				t.Fatal(err)
			}
			defer admin.Close(context.Background())
			deliverWhileKilling(t, e, "term", ordered, killing{
				every: 150 * time.Millisecond, timeout: 90 * time.Second, handle: time.Millisecond,
				kill: func() int64 {
					var k int64
					if err := admin.QueryRow(context.Background(), `SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()`, e.db.Name).Scan(&k); err != nil {
						return 0
					}
					return k
				},
			})
		})
	}
}

// killing says how deliverWhileKilling kills: kill (which returns how many
// connections it ended) every every, while handlers take handle each, for
// at most timeout; cfg configures the Subscriber (its Logger is set).
type killing struct {
	every, timeout, handle time.Duration
	kill                   func() int64
	cfg                    outbox.SubscriberConfig
}

// deliverWhileKilling delivers 2,000 events of stream (with 50 ordering
// keys when ordered) to a Subscriber of e's store while k.kill ends its
// connections over and over, and fails the test if an event is lost, or
// delivered twice though no ack write failed.
func deliverWhileKilling(t *testing.T, e *env, stream string, ordered bool, k killing) {
	t.Helper()
	const n = 2000
	evs := make([]outbox.Event, n)
	for i := range evs {
		evs[i] = outbox.Event{Stream: stream, Key: "ev-" + strconv.Itoa(i), Kind: "K", Payload: []byte("{}")}
		if ordered {
			evs[i].OrderingKey = "key-" + strconv.Itoa(i%50)
		}
	}
	e.enqueueAll(evs...)
	logs := &countingLogger{errors: map[string]int{}}
	cfg := k.cfg
	cfg.MaxInFlight, cfg.BatchSize, cfg.Logger = 16, 200, logs
	sub, msgs := subscribe(t, e.s, cfg, stream)
	defer sub.Close()
	counter := countDeliveries(msgs, 16, n, k.handle)

	var kills atomic.Int64
	stop := make(chan struct{})
	killed := make(chan struct{})
	go func() {
		defer close(killed)
		for {
			select {
			case <-stop:
				return
			case <-time.After(k.every):
			}
			kills.Add(k.kill())
		}
	}()
	select {
	case <-counter.all:
	case <-time.After(k.timeout):
	}
	close(stop)
	<-killed
	seen, dups := counter.result()
	t.Logf("%s: ended %d connections; %d of %d events seen, %d duplicates; errors logged: %v", stream, kills.Load(), len(seen), n, dups, logs.errors)
	if len(seen) != n {
		t.Fatalf("%d of %d events delivered", len(seen), n)
	}
	waitFor(t, "every event delivered", func() bool {
		// The test's own pool may still hold a connection the killing
		// ended: a failed read is tried again.
		got, err := e.tryCount("SELECT COUNT(*) FROM millpond_deliveries WHERE stream = ? AND status = 'delivered'", stream)
		return err == nil && got == n
	})
	if dups > 0 && logs.errors["Could not record acks; the events will be delivered again after their leases expire"] == 0 {
		t.Fatalf("%d events delivered twice though every ack was written", dups)
	}
}

// tryCount is count returning the read's error instead of failing the test.
func (e *env) tryCount(query string, args ...any) (int64, error) {
	var n int64
	var err error
	if e.db.Pool != nil {
		err = e.db.Pool.QueryRow(e.ctx, e.q(query), args...).Scan(&n)
	} else {
		err = e.db.SQL.QueryRowContext(e.ctx, e.q(query), args...).Scan(&n)
	}
	return n, err
}
