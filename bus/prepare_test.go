package bus_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millpond/millpond/bus"
	"github.com/millpond/millpond/handlers"
	"github.com/millpond/millpond/internal/testdb"
)

// probed is an event whose decoding is recorded, by run and order id.
type probed struct {
	Run     string   `json:"run"`
	OrderID int      `json:"order_id"`
	Items   []string `json:"items"`
}

var decodedProbes sync.Map // "run/order id" -> true

func (p *probed) UnmarshalJSON(b []byte) error {
	type plain probed
	if err := json.Unmarshal(b, (*plain)(p)); err != nil {
		return err
	}
	decodedProbes.Store(fmt.Sprintf("%s/%d", p.Run, p.OrderID), true)
	return nil
}

func probe(run string, id int) []byte {
	b, _ := json.Marshal(map[string]any{"run": run, "order_id": id, "items": []string{"first"}})
	return b
}

// startBusWith starts a bus whose router has the middleware (added after
// the bus's own).
func startBusWith(t *testing.T, b *bus.Bus, mw message.HandlerMiddleware) {
	t.Helper()
	b.Router().AddMiddleware(mw)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop(context.Background()) })
}

// A typed handler's payloads are decoded by the bus's subscriber before the
// router's goroutine for the message starts (so that goroutine needs no
// deep stack), and the handler gets what was decoded.
func TestTypedHandlerPayloadsAreDecodedBeforeTheRouter(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, dialect)
			store := db.Store(t)
			run := "before-router-" + dialect
			var mu sync.Mutex
			early, got := map[int]bool{}, map[int]int{}
			h := handlers.New("probe", "orders", "OrderPlaced", func(ctx context.Context, ev probed, _ handlers.Meta) error {
				mu.Lock()
				got[ev.OrderID]++
				mu.Unlock()
				return nil
			})
			b, err := bus.New(store, bus.Config{Subscriber: fastSubscriber}, h)
			if err != nil {
				t.Fatal(err)
			}
			startBusWith(t, b, func(next message.HandlerFunc) message.HandlerFunc {
				return func(msg *message.Message) ([]*message.Message, error) {
					var p struct {
						OrderID int `json:"order_id"`
					}
					_ = json.Unmarshal(msg.Payload, &p)
					_, done := decodedProbes.Load(fmt.Sprintf("%s/%d", run, p.OrderID))
					mu.Lock()
					early[p.OrderID] = done
					mu.Unlock()
					return next(msg)
				}
			})
			var payloads [][]byte
			for id := 1; id <= 20; id++ {
				payloads = append(payloads, probe(run, id))
			}
			publish(t, db, store, "orders", "OrderPlaced", payloads...)
			waitFor(t, "every event handled", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(got) == 20
			})
			mu.Lock()
			defer mu.Unlock()
			for id := 1; id <= 20; id++ {
				if got[id] != 1 || !early[id] {
					t.Errorf("order %d: handled %d times, decoded before the router's handler: %v; want once, true", id, got[id], early[id])
				}
			}
		})
	}
}

// A middleware that replaces the payload has the handler decode the new
// one, not get what the subscriber decoded before.
func TestTypedHandlerDecodesAPayloadAMiddlewareReplaced(t *testing.T) {
	db := testdb.New(t, "sqlite")
	store := db.Store(t)
	const run = "replaced"
	var mu sync.Mutex
	got := map[int]bool{}
	h := handlers.New("probe", "orders", "OrderPlaced", func(ctx context.Context, ev probed, _ handlers.Meta) error {
		mu.Lock()
		got[ev.OrderID] = true
		mu.Unlock()
		return nil
	})
	b, err := bus.New(store, bus.Config{Subscriber: fastSubscriber}, h)
	if err != nil {
		t.Fatal(err)
	}
	startBusWith(t, b, func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			var p probed
			if err := json.Unmarshal(msg.Payload, &p); err != nil {
				return nil, err
			}
			msg.Payload = probe(run, p.OrderID+1000)
			return next(msg)
		}
	})
	publish(t, db, store, "orders", "OrderPlaced", probe(run, 1), probe(run, 2))
	waitFor(t, "both events handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) >= 2
	})
	mu.Lock()
	defer mu.Unlock()
	if !got[1001] || !got[1002] || len(got) != 2 {
		t.Fatalf("the handler got orders %v, want 1001 and 1002 (the payloads the middleware set)", got)
	}
}

// A message handled twice (Watermill's Retry middleware does) is decoded
// afresh the second time: the first handling's changes to what the event
// refers to do not reach the second.
func TestTypedHandlerDecodesAgainWhenHandledAgain(t *testing.T) {
	db := testdb.New(t, "sqlite")
	store := db.Store(t)
	var mu sync.Mutex
	var seen []string
	h := handlers.New("probe", "orders", "OrderPlaced", func(ctx context.Context, ev probed, _ handlers.Meta) error {
		mu.Lock()
		seen = append(seen, ev.Items[0])
		mu.Unlock()
		ev.Items[0] = "changed by the first handling"
		if len(seen) == 1 {
			return errors.New("the first handling fails")
		}
		return nil
	})
	b, err := bus.New(store, bus.Config{Subscriber: fastSubscriber}, h)
	if err != nil {
		t.Fatal(err)
	}
	startBusWith(t, b, func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			if _, err := next(msg); err == nil {
				return nil, nil
			}
			return next(msg) // an in-memory retry
		}
	})
	publish(t, db, store, "orders", "OrderPlaced", probe("again", 1))
	waitFor(t, "the second handling", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) >= 2
	})
	mu.Lock()
	defer mu.Unlock()
	if seen[0] != "first" || seen[1] != "first" {
		t.Fatalf("the handlings saw items %q, want the payload's %q both times", seen, "first")
	}
}
