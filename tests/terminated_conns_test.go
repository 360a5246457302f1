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
			const n = 2000
			evs := make([]outbox.Event, n)
			for i := range evs {
				evs[i] = outbox.Event{Stream: "term", Key: "ev-" + strconv.Itoa(i), Kind: "K", Payload: []byte("{}")}
				if ordered {
					evs[i].OrderingKey = "key-" + strconv.Itoa(i%50)
				}
			}
			e.enqueueAll(evs...)
			logs := &countingLogger{errors: map[string]int{}}
			_, msgs := subscribe(t, e.s, outbox.SubscriberConfig{MaxInFlight: 16, BatchSize: 200, Logger: logs}, "term")
			counter := countDeliveries(msgs, 16, n, time.Millisecond)

			admin, err := pgx.Connect(context.Background(), testdb.PostgresURL())
			if err != nil {
				t.Fatal(err)
			}
			defer admin.Close(context.Background())
			var kills atomic.Int64
			stop := make(chan struct{})
			killed := make(chan struct{})
			go func() {
				defer close(killed)
				for {
					select {
					case <-stop:
						return
					case <-time.After(150 * time.Millisecond):
					}
					var k int64
					if err := admin.QueryRow(context.Background(), `SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()`, e.db.Name).Scan(&k); err == nil {
						kills.Add(k)
					}
				}
			}()
			select {
			case <-counter.all:
			case <-time.After(90 * time.Second):
			}
			close(stop)
			<-killed
			seen, dups := counter.result()
			t.Logf("terminated %d connections; %d of %d events seen, %d duplicates; errors logged: %v", kills.Load(), len(seen), n, dups, logs.errors)
			if len(seen) != n {
				t.Fatalf("%d of %d events delivered", len(seen), n)
			}
			waitFor(t, "every event delivered", func() bool {
				return e.count("SELECT COUNT(*) FROM millpond_deliveries WHERE stream = ? AND status = 'delivered'", "term") == n
			})
			if dups > 0 && logs.errors["Could not record acks; the events will be delivered again after their leases expire"] == 0 {
				t.Fatalf("%d events delivered twice though every ack was written", dups)
			}
		})
	}
}
