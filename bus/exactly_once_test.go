package bus_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millpond/millpond/bus"
	"github.com/millpond/millpond/handlers"
	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// TestTypedHandlerAcknowledgesInItsTransaction: a typed handler writes its
// effect and acknowledges its delivery (Meta.AcknowledgeInTx) in one
// transaction of its own. Every event's effect is written exactly once,
// including events whose first attempt rolled back; every event ends
// delivered; and the bus neither acknowledges again nor reports a lost
// lease.
func TestTypedHandlerAcknowledgesInItsTransaction(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			const events = 60
			ctx := context.Background()
			db := testdb.New(t, dialect)
			store := db.Store(t)
			sqlDB := store.SQLDB()
			if _, err := sqlDB.ExecContext(ctx, "CREATE TABLE effects (order_id INTEGER PRIMARY KEY)"); err != nil {
				t.Fatal(err)
			}
			insert := "INSERT INTO effects (order_id) VALUES (?)"
			if dialect == "postgres" {
				insert = "INSERT INTO effects (order_id) VALUES ($1)"
			}
			selectStatus := "SELECT status FROM millpond_outbox WHERE id = ?"
			if dialect == "postgres" {
				selectStatus = "SELECT status FROM millpond_outbox WHERE id = $1"
			}
			var mu sync.Mutex
			attempts := map[int]int{}
			var notDelivered []string
			h := handlers.New("effects", "orders", "OrderPlaced", func(ctx context.Context, ev orderPlaced, m handlers.Meta) error {
				mu.Lock()
				attempts[ev.OrderID]++
				first := attempts[ev.OrderID] == 1
				mu.Unlock()
				tx, err := sqlDB.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer tx.Rollback()
				if _, err := tx.ExecContext(ctx, insert, ev.OrderID); err != nil {
					return err
				}
				if err := m.AcknowledgeInTx(ctx, outbox.SQLTx(tx)); err != nil {
					return err
				}
				if first && ev.OrderID%3 == 0 {
					return errors.New("failed after the write: rolled back, retried")
				}
				if err := tx.Commit(); err != nil {
					return err
				}
				// The acknowledgement committed with the effect: the event is
				// delivered before the handler even returns.
				var status string
				if err := sqlDB.QueryRowContext(ctx, selectStatus, m.EventID).Scan(&status); err != nil {
					return err
				}
				if status != outbox.StatusDelivered {
					mu.Lock()
					notDelivered = append(notDelivered, fmt.Sprintf("order %d: %s", ev.OrderID, status))
					mu.Unlock()
				}
				return nil
			}, handlers.WithMaxInFlight(4), handlers.WithLease(5*time.Second))
			logs := watermill.NewCaptureLogger()
			b, err := bus.New(store, bus.Config{Logger: logs, Subscriber: fastSubscriber}, h)
			if err != nil {
				t.Fatal(err)
			}
			if err := b.Start(ctx); err != nil {
				t.Fatal(err)
			}
			payloads := make([][]byte, events)
			for i := range payloads {
				payloads[i] = order(i + 1)
			}
			publish(t, db, store, "orders", "OrderPlaced", payloads...)
			deadline := time.Now().Add(30 * time.Second)
			for db.Count(t, "SELECT COUNT(*) FROM millpond_outbox WHERE status = 'delivered'") < events {
				if time.Now().After(deadline) {
					t.Fatalf("delivered %d of %d", db.Count(t, "SELECT COUNT(*) FROM millpond_outbox WHERE status = 'delivered'"), events)
				}
				time.Sleep(20 * time.Millisecond)
			}
			if err := b.Stop(ctx); err != nil {
				t.Fatal(err)
			}
			if n := db.Count(t, "SELECT COUNT(*) FROM effects"); n != events {
				t.Fatalf("%d effects for %d events", n, events)
			}
			mu.Lock()
			if len(notDelivered) > 0 {
				t.Errorf("events not delivered when their handler's transaction committed: %v", notDelivered)
			}
			for id := 1; id <= events; id++ {
				want := 1
				if id%3 == 0 {
					want = 2
				}
				if attempts[id] != want {
					t.Errorf("order %d handled %d times, want %d", id, attempts[id], want)
				}
			}
			mu.Unlock()
			var lines []string
			for _, msgs := range logs.Captured() {
				for _, m := range msgs {
					lines = append(lines, fmt.Sprint(m.Msg, " ", m.Fields))
				}
			}
			for _, l := range lines {
				if strings.Contains(l, "lost their leases") || strings.Contains(strings.ToLower(l), "stale") {
					t.Errorf("false warning: %s", l)
				}
			}
		})
	}
}
