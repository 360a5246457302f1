package bus_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millpond/millpond/bus"
	"github.com/millpond/millpond/handlers"
	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

type step struct {
	Key string `json:"key"`
	I   int    `json:"i"`
}

// TestOrderedHandlers publishes events with an ordering key
// (outbox.MetadataOrderingKey) and runs two handlers of their kind with
// MaxInFlight 8: each sees every key's events in sequence, one at a time,
// with the key in its Meta. Event b/2 fails permanently: the skip handler
// goes on with b/3, the hold handler stops key b there (and Stats counts
// the held key), while both finish keys a and c.
func TestOrderedHandlers(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, dialect)
			store := db.Store(t)
			const perKey = 15
			type seen struct {
				mu       sync.Mutex
				next     map[string]int
				inFlight map[string]bool
				errs     []string
				done     int
			}
			record := func(s *seen, fail bool) handlers.Func[step] {
				return func(ctx context.Context, ev step, meta handlers.Meta) error {
					s.mu.Lock()
					if s.inFlight[ev.Key] {
						s.errs = append(s.errs, "two events of "+ev.Key+" in flight")
					}
					s.inFlight[ev.Key] = true
					if meta.OrderingKey != ev.Key || meta.OrderingSeq != int64(ev.I+1) {
						s.errs = append(s.errs, fmt.Sprintf("meta %q/%d for %s/%d", meta.OrderingKey, meta.OrderingSeq, ev.Key, ev.I))
					}
					if want := s.next[ev.Key]; ev.I != want && !(fail && ev.Key == "b" && ev.I == 3 && want == 2) {
						s.errs = append(s.errs, fmt.Sprintf("%s: got %d, want %d", ev.Key, ev.I, want))
					}
					s.mu.Unlock()
					time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
					s.mu.Lock()
					defer s.mu.Unlock()
					delete(s.inFlight, ev.Key)
					if ev.Key == "b" && ev.I == 2 {
						return handlers.Permanent(errors.New("poison"))
					}
					s.next[ev.Key] = ev.I + 1
					s.done++
					return nil
				}
			}
			skip := &seen{next: map[string]int{}, inFlight: map[string]bool{}}
			hold := &seen{next: map[string]int{}, inFlight: map[string]bool{}}
			b, err := bus.New(store, bus.Config{Subscriber: fastSubscriber},
				handlers.New("skipper", "steps", "Step", record(skip, true), handlers.WithMaxInFlight(8), handlers.WithDeadLetterPolicy(handlers.DeadLetterSkip)),
				handlers.New("holder", "steps", "Step", record(hold, false), handlers.WithMaxInFlight(8)),
			)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if err := b.RegisterGroups(ctx); err != nil {
				t.Fatal(err)
			}
			publishSteps(t, db, store, perKey, "a", "b", "c")
			if err := b.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer b.Stop(ctx)
			deadline := time.Now().Add(60 * time.Second)
			for {
				skip.mu.Lock()
				hold.mu.Lock()
				ds, dh := skip.done, hold.done
				hold.mu.Unlock()
				skip.mu.Unlock()
				if ds == 3*perKey-1 && dh == 2*perKey+2 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("handled %d (skip) and %d (hold) events", ds, dh)
				}
				time.Sleep(20 * time.Millisecond)
			}
			time.Sleep(200 * time.Millisecond) // nothing more arrives for the holder
			for _, s := range []*seen{skip, hold} {
				s.mu.Lock()
				for _, e := range s.errs {
					t.Error(e)
				}
				s.mu.Unlock()
			}
			if hold.next["b"] != 2 || hold.done != 2*perKey+2 {
				t.Fatalf("the holder went past the dead head of key b: next %d, done %d", hold.next["b"], hold.done)
			}
			stats, err := store.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, st := range stats {
				want := map[string][2]int64{"holder": {1, perKey - 3}, "skipper": {0, 0}}[st.Group]
				if st.HeldKeys != want[0] || st.Blocked != want[1] {
					t.Errorf("group %q: held keys %d, blocked %d; want %v", st.Group, st.HeldKeys, st.Blocked, want)
				}
			}
		})
	}
}

// TestHandlerHoldOverridesABusSkip: a handler that asks for DeadLetterHold
// (handlers.WithDeadLetterPolicy(handlers.DeadLetterHold)) on a bus whose
// Subscriber default is DeadLetterSkip holds its keys. Hold was the zero
// value, taken for "the bus's": the later events of a dead head's key were
// handed to it although it asked to hold them.
func TestHandlerHoldOverridesABusSkip(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, dialect)
			store := db.Store(t)
			var mu sync.Mutex
			var handled []int
			h := handlers.New("holder", "steps", "Step", func(ctx context.Context, ev step, m handlers.Meta) error {
				mu.Lock()
				handled = append(handled, ev.I)
				mu.Unlock()
				if ev.I == 0 {
					return handlers.Permanent(errors.New("poison head"))
				}
				return nil
			}, handlers.WithDeadLetterPolicy(handlers.DeadLetterHold))
			cfg := bus.Config{Subscriber: fastSubscriber}
			cfg.Subscriber.DeadLetterPolicy = outbox.DeadLetterSkip // the bus-wide default
			b, err := bus.New(store, cfg, h)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if err := b.RegisterGroups(ctx); err != nil {
				t.Fatal(err)
			}
			publishSteps(t, db, store, 2, "k")
			if err := b.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer b.Stop(ctx)
			waitFor(t, "the dead head", func() bool {
				d, err := store.ListDead(ctx, outbox.DeadQuery{Stream: "steps", Group: "holder", Limit: 10})
				if err != nil {
					t.Fatal(err)
				}
				return len(d) == 1
			})
			time.Sleep(time.Second)
			mu.Lock()
			defer mu.Unlock()
			if len(handled) != 1 {
				t.Fatalf("handler asked for DeadLetterHold, yet after its dead head it was given %v (want only [0]): the bus default Skip won", handled)
			}
		})
	}
}

// publishSteps publishes, in one transaction, perKey Step events of each
// ordering key, round robin over the keys (step I of every key, then I+1).
func publishSteps(t *testing.T, db *testdb.Database, store *outbox.Store, perKey int, keys ...string) {
	t.Helper()
	tx, commit, rollback := db.Begin(t)
	pub, err := outbox.NewPublisher(store, tx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range perKey {
		for _, k := range keys {
			p, _ := json.Marshal(step{Key: k, I: i})
			msg := message.NewMessage(watermill.NewUUID(), p)
			msg.Metadata.Set(outbox.MetadataKind, "Step")
			msg.Metadata.Set(outbox.MetadataOrderingKey, k)
			if err := pub.Publish("steps", msg); err != nil {
				rollback()
				t.Fatal(err)
			}
		}
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}
}

// TestOldKindHeadDoesNotHoldItsKey: an ordered event written while a
// handler's group took its kind, and handed to the handler after it
// changed kind, is dead-lettered with the reason, without holding the
// later events of its key, although the handler holds its keys
// (DeadLetterHold, the default): it would refuse the event after any
// requeue, so its key would stay blocked for good.
func TestOldKindHeadDoesNotHoldItsKey(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, dialect)
			store := db.Store(t)
			ctx := context.Background()
			var mu sync.Mutex
			var handled []string
			record := func(ctx context.Context, ev step, m handlers.Meta) error {
				mu.Lock()
				defer mu.Unlock()
				handled = append(handled, fmt.Sprintf("%s/%d", m.Kind, ev.I))
				return nil
			}
			old, err := bus.New(store, bus.Config{Subscriber: fastSubscriber}, handlers.New("h", "steps", "Step", record))
			if err != nil {
				t.Fatal(err)
			}
			if err := old.RegisterGroups(ctx); err != nil {
				t.Fatal(err)
			}
			publishSteps(t, db, store, 1, "k") // Step k/0, in group h
			startBus(t, store, bus.Config{Subscriber: fastSubscriber}, handlers.New("h", "steps", "Paid", record))
			tx, commit, _ := db.Begin(t)
			for i := 1; i <= 2; i++ {
				p, _ := json.Marshal(step{Key: "k", I: i})
				if _, err := store.Enqueue(ctx, tx, outbox.Event{Stream: "steps", Key: fmt.Sprintf("paid-%d", i), Kind: "Paid", Payload: p, OrderingKey: "k"}); err != nil {
					t.Fatal(err)
				}
			}
			if err := commit(); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the key's later events", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(handled) == 2
			})
			mu.Lock()
			if fmt.Sprint(handled) != "[Paid/1 Paid/2]" {
				t.Errorf("handled %v, want [Paid/1 Paid/2]", handled)
			}
			mu.Unlock()
			dead, err := store.ListDead(ctx, outbox.DeadQuery{Stream: "steps", Group: "h", Limit: 10})
			if err != nil {
				t.Fatal(err)
			}
			if len(dead) != 1 || dead[0].Kind != "Step" || !strings.Contains(dead[0].LastError, `takes kind "Paid", not "Step"`) {
				t.Fatalf("dead letters of h: %+v", dead)
			}
		})
	}
}
