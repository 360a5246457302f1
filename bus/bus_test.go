package bus_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/millpond/millpond/bus"
	"github.com/millpond/millpond/handlers"
	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

type orderPlaced struct {
	OrderID int `json:"order_id"`
}

// fastSubscriber keeps the tests quick: short polls, no retry delay.
var fastSubscriber = outbox.SubscriberConfig{
	PollInterval: 10 * time.Millisecond,
	Backoff:      func(int) time.Duration { return 0 },
	CloseTimeout: 5 * time.Second,
}

// publish enqueues events in one transaction through a Publisher bound to it.
func publish(t *testing.T, db *testdb.Database, store *outbox.Store, stream, kind string, payloads ...[]byte) {
	t.Helper()
	tx, commit, rollback := db.Begin(t)
	pub, err := outbox.NewPublisher(store, tx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range payloads {
		msg := message.NewMessage(watermill.NewUUID(), p)
		msg.Metadata.Set(outbox.MetadataKind, kind)
		if err := pub.Publish(stream, msg); err != nil {
			rollback()
			t.Fatal(err)
		}
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}
}

func order(id int) []byte {
	b, _ := json.Marshal(orderPlaced{OrderID: id})
	return b
}

// counter records how often each order id was handled.
type counter struct {
	mu   sync.Mutex
	seen map[int]int
}

func newCounter() *counter { return &counter{seen: map[int]int{}} }

func (c *counter) add(id int) {
	c.mu.Lock()
	c.seen[id]++
	c.mu.Unlock()
}

func (c *counter) snapshot() map[int]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[int]int, len(c.seen))
	for k, v := range c.seen {
		out[k] = v
	}
	return out
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func startBus(t *testing.T, store *outbox.Store, cfg bus.Config, hs ...handlers.Handler) *bus.Bus {
	t.Helper()
	b, err := bus.New(store, cfg, hs...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop(context.Background()) })
	return b
}

func TestBus(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Run("RoutesByKindToEveryHandlerOnce", func(t *testing.T) { testRoutes(t, dialect) })
			t.Run("PerHandlerRetryPolicyAndPanics", func(t *testing.T) { testRetries(t, dialect) })
			t.Run("UndecodableAndUnroutedAreDeadLettered", func(t *testing.T) { testDeadLetters(t, dialect) })
			t.Run("GracefulStopLosesNothing", func(t *testing.T) { testGracefulStop(t, dialect) })
		})
	}
}

func testRoutes(t *testing.T, dialect string) {
	t.Parallel()
	db := testdb.New(t, dialect)
	store := db.Store(t)
	reserve, notify, cancelled := newCounter(), newCounter(), newCounter()
	var withDeadline atomic.Int64
	record := func(c *counter) handlers.Func[orderPlaced] {
		return func(ctx context.Context, ev orderPlaced, meta handlers.Meta) error {
			if _, ok := ctx.Deadline(); ok {
				withDeadline.Add(1)
			}
			c.add(ev.OrderID)
			return nil
		}
	}
	b, err := bus.New(store, bus.Config{Subscriber: fastSubscriber},
		handlers.New("reserve-stock", "orders", "OrderPlaced", record(reserve)),
		handlers.New("notify", "orders", "OrderPlaced", record(notify)),
		handlers.New("refund", "orders", "OrderCancelled", record(cancelled)),
	)
	if err != nil {
		t.Fatal(err)
	}
	// Watermill's own middleware runs on the bus's router.
	b.Router().AddMiddleware(middleware.Recoverer, middleware.Timeout(10*time.Second))
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop(context.Background()) })

	var placed, cancelledPayloads [][]byte
	for i := 1; i <= 100; i++ {
		placed = append(placed, order(i))
	}
	for i := 1001; i <= 1010; i++ {
		cancelledPayloads = append(cancelledPayloads, order(i))
	}
	publish(t, db, store, "orders", "OrderPlaced", placed...)
	publish(t, db, store, "orders", "OrderCancelled", cancelledPayloads...)
	waitFor(t, "all deliveries", func() bool {
		return len(reserve.snapshot()) == 100 && len(notify.snapshot()) == 100 && len(cancelled.snapshot()) == 10
	})
	time.Sleep(100 * time.Millisecond) // let any duplicate show
	for name, c := range map[string]*counter{"reserve": reserve, "notify": notify, "refund": cancelled} {
		for id, n := range c.snapshot() {
			if n != 1 {
				t.Errorf("%s handled order %d %d times", name, id, n)
			}
			if name == "refund" && id <= 1000 || name != "refund" && id > 1000 {
				t.Errorf("%s got an event of another kind (order %d)", name, id)
			}
		}
	}
	if got := withDeadline.Load(); got != 210 {
		t.Errorf("the Timeout middleware's deadline reached %d of 210 deliveries", got)
	}
	// Each handler's group has its own rows: once the acks (written in
	// batches after the handlers return) land, nothing is left for anyone.
	var left []outbox.StreamStats
	waitFor(t, "every delivery acknowledged", func() bool {
		stats, err := store.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		left = left[:0]
		for _, s := range stats {
			if s.Pending+s.Processing+s.Dead > 0 {
				left = append(left, s)
			}
		}
		return len(left) == 0
	})
}

func testRetries(t *testing.T, dialect string) {
	t.Parallel()
	db := testdb.New(t, dialect)
	store := db.Store(t)
	var flakyAttempts, panicAttempts, steadyCalls atomic.Int64
	flaky := handlers.New("flaky", "orders", "OrderPlaced", func(ctx context.Context, ev orderPlaced, meta handlers.Meta) error {
		flakyAttempts.Add(1)
		if meta.Attempt < 3 {
			return fmt.Errorf("transient failure on attempt %d", meta.Attempt)
		}
		return nil
	}, handlers.WithMaxAttempts(5), handlers.WithBackoff(func(int) time.Duration { return 0 }))
	panicky := handlers.New("panicky", "orders", "OrderPlaced", func(ctx context.Context, ev orderPlaced, meta handlers.Meta) error {
		panicAttempts.Add(1)
		panic("boom\nwith a newline")
	}, handlers.WithMaxAttempts(2))
	steady := handlers.New("steady", "orders", "OrderPlaced", func(ctx context.Context, ev orderPlaced, meta handlers.Meta) error {
		steadyCalls.Add(1)
		return nil
	})
	startBus(t, store, bus.Config{Subscriber: fastSubscriber}, flaky, panicky, steady)
	publish(t, db, store, "orders", "OrderPlaced", order(1))

	dead := func() []outbox.DeadEvent {
		d, err := store.ListDead(context.Background(), outbox.DeadQuery{Stream: "orders", AllGroups: true, Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	waitFor(t, "the panicking handler's dead letter", func() bool { return len(dead()) == 1 })
	waitFor(t, "the flaky handler's third attempt", func() bool { return flakyAttempts.Load() == 3 })
	d := dead()[0]
	if d.Group != "panicky" || d.Attempts != 2 || panicAttempts.Load() != 2 {
		t.Errorf("panicking handler: dead letter %+v after %d attempts, want group panicky with 2", d, panicAttempts.Load())
	}
	if !strings.Contains(d.LastError, "panic: boom") || strings.ContainsAny(d.LastError, "\n\t") || len(d.LastError) > outbox.MaxErrorBytes {
		t.Errorf("last error not sanitised: %q", d.LastError)
	}
	waitFor(t, "the steady handler", func() bool { return steadyCalls.Load() >= 1 })
	time.Sleep(200 * time.Millisecond) // the others' retries must not reach it
	if steadyCalls.Load() != 1 {
		t.Errorf("steady handler ran %d times, want 1 (retries of others must not touch it)", steadyCalls.Load())
	}
}

func testDeadLetters(t *testing.T, dialect string) {
	t.Parallel()
	db := testdb.New(t, dialect)
	store := db.Store(t)
	var calls atomic.Int64
	h := handlers.New("reserve-stock", "orders", "OrderPlaced", func(context.Context, orderPlaced, handlers.Meta) error {
		calls.Add(1)
		return nil
	})
	startBus(t, store, bus.Config{Subscriber: fastSubscriber}, h)
	publish(t, db, store, "orders", "OrderPlaced", []byte("not json"))
	publish(t, db, store, "orders", "OrderShipped", order(7))
	var dead []outbox.DeadEvent
	waitFor(t, "two dead letters", func() bool {
		var err error
		dead, err = store.ListDead(context.Background(), outbox.DeadQuery{Stream: "orders", AllGroups: true, Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		return len(dead) == 2
	})
	byGroup := map[string]outbox.DeadEvent{}
	for _, d := range dead {
		byGroup[d.Group] = d
	}
	if d := byGroup["reserve-stock"]; d.Attempts != 1 || !strings.Contains(d.LastError, "decode") {
		t.Errorf("undecodable payload: %+v, want dead after 1 attempt with a decode error", d)
	}
	if d := byGroup[""]; d.Kind != "OrderShipped" || !strings.Contains(d.LastError, `no handler for event kind "OrderShipped"`) {
		t.Errorf("unrouted event: %+v", d)
	}
	if calls.Load() != 0 {
		t.Errorf("handler ran %d times for events it cannot take", calls.Load())
	}
}

func testGracefulStop(t *testing.T, dialect string) {
	t.Parallel()
	db := testdb.New(t, dialect)
	store := db.Store(t)
	seen := newCounter()
	slow := func(ctx context.Context, ev orderPlaced, meta handlers.Meta) error {
		time.Sleep(2 * time.Millisecond)
		if ctx.Err() != nil {
			return errors.New("context cancelled while handling")
		}
		seen.add(ev.OrderID)
		return nil
	}
	const total = 400
	var payloads [][]byte
	for i := 1; i <= total; i++ {
		payloads = append(payloads, order(i))
	}
	h := func() handlers.Handler {
		return handlers.New("slow", "orders", "OrderPlaced", slow, handlers.WithMaxInFlight(4))
	}
	b1, err := bus.New(store, bus.Config{Subscriber: fastSubscriber}, h())
	if err != nil {
		t.Fatal(err)
	}
	if err := b1.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	publish(t, db, store, "orders", "OrderPlaced", payloads...)
	waitFor(t, "some progress", func() bool { return len(seen.snapshot()) >= total/4 })
	if err := b1.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	stopped := len(seen.snapshot())
	if stopped >= total {
		t.Fatalf("the bus finished all %d events before the stop; the test proves nothing", total)
	}
	// After a graceful stop nothing may be left claimed: what was not
	// started was released, what ran was acknowledged.
	if n := db.Count(t, "SELECT COUNT(*) FROM millpond_outbox WHERE status = 'processing'"); n != 0 {
		t.Errorf("%d events still claimed after a graceful stop", n)
	}
	startBus(t, store, bus.Config{Subscriber: fastSubscriber}, h())
	waitFor(t, "every event after the restart", func() bool { return len(seen.snapshot()) == total })
	time.Sleep(100 * time.Millisecond)
	for id, n := range seen.snapshot() {
		if n != 1 {
			t.Errorf("order %d handled %d times across a graceful stop", id, n)
		}
	}
	t.Logf("stopped after %d of %d events; all delivered exactly once across the stop", stopped, total)
}

// The handlers package cannot import outbox; its metadata keys must still
// match what the Subscriber sets.
func TestHandlersMetaMatchesSubscriberMetadata(t *testing.T) {
	msg := message.NewMessage("k", nil)
	msg.Metadata.Set(outbox.MetadataKind, "K")
	msg.Metadata.Set(outbox.MetadataAttempt, "3")
	msg.Metadata.Set(outbox.MetadataEventID, "9")
	if m := handlers.MetaOf(msg); m.Kind != "K" || m.Attempt != 3 || m.EventID != 9 {
		t.Errorf("handlers.MetaOf read %+v", m)
	}
}

func TestBusRefusesHandlersThatWouldTakeOthersEvents(t *testing.T) {
	db := testdb.New(t, "sqlite")
	store := db.Store(t)
	fn := func(context.Context, orderPlaced, handlers.Meta) error { return nil }
	for name, h := range map[string]handlers.Handler{
		"empty kind":   handlers.New("reserve", "orders", "", fn),
		"empty name":   handlers.New("", "orders", "OrderPlaced", fn),
		"empty stream": handlers.New("reserve", "", "OrderPlaced", fn),
		"bad name":     handlers.New("reserve stock", "orders", "OrderPlaced", fn),
	} {
		if _, err := bus.New(store, bus.Config{}, h); !errors.Is(err, outbox.ErrInvalidKey) {
			t.Errorf("%s: %v, want ErrInvalidKey", name, err)
		}
	}
	if _, err := bus.New(store, bus.Config{}, handlers.New("a", "orders", "K", fn), handlers.New("a", "orders", "K", fn)); !errors.Is(err, bus.ErrDuplicateHandler) {
		t.Errorf("duplicate names: %v", err)
	}
}

// TestBusRefusesInvalidConfig: a policy value outside the three, or a
// negative close timeout (the router would give up on a running handler at
// once), is refused rather than taken for a default.
func TestBusRefusesInvalidConfig(t *testing.T) {
	db := testdb.New(t, "sqlite")
	store := db.Store(t)
	h := handlers.New("reserve", "orders", "OrderPlaced", func(context.Context, orderPlaced, handlers.Meta) error { return nil })
	for name, cfg := range map[string]bus.Config{
		"Unrouted 3":            {Unrouted: bus.UnroutedAcknowledge + 1},
		"Unrouted -1":           {Unrouted: bus.UnroutedPolicy(-1)},
		"negative CloseTimeout": {CloseTimeout: -time.Second},
	} {
		if _, err := bus.New(store, cfg, h); !errors.Is(err, bus.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	odd := handlers.New("odd", "orders", "OrderPlaced", func(context.Context, orderPlaced, handlers.Meta) error { return nil },
		handlers.WithDeadLetterPolicy(handlers.DeadLetterSkip+1))
	if _, err := bus.New(store, bus.Config{}, odd); !errors.Is(err, bus.ErrInvalidConfig) {
		t.Errorf("a handler's unknown dead-letter policy: %v, want ErrInvalidConfig", err)
	}
	if _, err := bus.New(nil, bus.Config{}, h); !errors.Is(err, bus.ErrInvalidConfig) {
		t.Errorf("nil store: %v, want ErrInvalidConfig", err)
	}
	for _, p := range []bus.UnroutedPolicy{bus.UnroutedDeadLetter, bus.UnroutedKeep, bus.UnroutedAcknowledge} {
		if _, err := bus.New(store, bus.Config{Unrouted: p}, h); err != nil {
			t.Errorf("Unrouted %d: %v", p, err)
		}
	}
}

// A handler whose kind changed between deployments must not receive, or
// silently acknowledge, events of its old kind.
func TestBusHandlerKindChangeDropsNothing(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, dialect)
			store := db.Store(t)
			var calls atomic.Int64
			fn := func(context.Context, orderPlaced, handlers.Meta) error { calls.Add(1); return nil }
			first, err := bus.New(store, bus.Config{Subscriber: fastSubscriber}, handlers.New("h1", "orders", "KindA", fn))
			if err != nil {
				t.Fatal(err)
			}
			if err := first.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := first.Stop(context.Background()); err != nil {
				t.Fatal(err)
			}
			// Stop again: returns at once.
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if err := first.Stop(ctx); err != nil {
				t.Fatalf("second Stop: %v", err)
			}
			startBus(t, store, bus.Config{Subscriber: fastSubscriber}, handlers.New("h1", "orders", "KindB", fn))
			publish(t, db, store, "orders", "KindA", order(1))
			var dead []outbox.DeadEvent
			waitFor(t, "the old-kind event to be dead-lettered as unrouted", func() bool {
				dead, err = store.ListDead(context.Background(), outbox.DeadQuery{Stream: "orders", AllGroups: true, Limit: 10})
				if err != nil {
					t.Fatal(err)
				}
				return len(dead) == 1
			})
			if dead[0].Group != "" || !strings.Contains(dead[0].LastError, `no handler for event kind "KindA"`) {
				t.Errorf("dead letter %+v", dead[0])
			}
			if calls.Load() != 0 {
				t.Errorf("the handler ran %d times for a kind it no longer takes", calls.Load())
			}
		})
	}
}

// Events of a kind published before any handler took it are dead-lettered
// as unrouted; once a handler for the kind exists, Reroute delivers them.
func TestUnroutedDeadLettersCanBeRerouted(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, dialect)
			store := db.Store(t)
			fn := func(context.Context, orderPlaced, handlers.Meta) error { return nil }
			seen := newCounter()
			refund := func(ctx context.Context, ev orderPlaced, m handlers.Meta) error { seen.add(ev.OrderID); return nil }
			first := startBus(t, store, bus.Config{Subscriber: fastSubscriber}, handlers.New("reserve", "orders", "OrderPlaced", fn))
			publish(t, db, store, "orders", "OrderCancelled", order(1), order(2))
			var dead []outbox.DeadEvent
			waitFor(t, "two unrouted dead letters", func() bool {
				var err error
				dead, err = store.ListDead(context.Background(), outbox.DeadQuery{Stream: "orders", Limit: 10})
				if err != nil {
					t.Fatal(err)
				}
				return len(dead) == 2
			})
			if err := first.Stop(context.Background()); err != nil {
				t.Fatal(err)
			}
			// Without a group for the kind, nothing moves.
			if n, err := store.Reroute(context.Background(), "orders", dead[0].ID, dead[1].ID); err != nil || n != 0 {
				t.Fatalf("reroute with no group for the kind: %d, %v", n, err)
			}
			startBus(t, store, bus.Config{Subscriber: fastSubscriber},
				handlers.New("reserve", "orders", "OrderPlaced", fn), handlers.New("refund", "orders", "OrderCancelled", refund))
			n, err := store.Reroute(context.Background(), "orders", dead[0].ID, dead[1].ID, 999999)
			if err != nil || n != 2 {
				t.Fatalf("reroute: %d, %v; want 2", n, err)
			}
			waitFor(t, "the rerouted events", func() bool { return len(seen.snapshot()) == 2 })
			if left, _ := store.ListDead(context.Background(), outbox.DeadQuery{Stream: "orders", AllGroups: true, Limit: 10}); len(left) != 0 {
				t.Errorf("dead letters left: %v", left)
			}
		})
	}
}

// TestHandlerHoldClaims: a handler built WithHoldClaims gets its events from
// held claims (its Meta.AcknowledgeInTx refuses them) while a handler of the
// same bus without the option acknowledges in its own transaction; each
// handles every event once. Other databases refuse the option at New.
func TestHandlerHoldClaims(t *testing.T) {
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		db := testdb.New(t, "postgres")
		store := db.Store(t)
		held, inTx := newCounter(), newCounter()
		var heldRefused, inTxErrors atomic.Int64
		sub := fastSubscriber
		sub.HoldClaimsAfter = -1 // held from the first claim
		b, err := bus.New(store, bus.Config{Subscriber: sub},
			handlers.New("held", "orders", "OrderPlaced", func(ctx context.Context, ev orderPlaced, meta handlers.Meta) error {
				tx, err := store.SQLDB().BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer func() { _ = tx.Rollback() }()
				if errors.Is(meta.AcknowledgeInTx(ctx, outbox.SQLTx(tx)), outbox.ErrNoReceipt) {
					heldRefused.Add(1)
				}
				held.add(ev.OrderID)
				return nil
			}, handlers.WithHoldClaims()),
			handlers.New("in-tx", "orders", "OrderPlaced", func(ctx context.Context, ev orderPlaced, meta handlers.Meta) error {
				tx, err := store.SQLDB().BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				if err := meta.AcknowledgeInTx(ctx, outbox.SQLTx(tx)); err != nil {
					inTxErrors.Add(1)
					_ = tx.Rollback()
					return err
				}
				if err := tx.Commit(); err != nil {
					return err
				}
				inTx.add(ev.OrderID)
				return nil
			}),
		)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Stop(context.Background()) })
		var payloads [][]byte
		for i := 1; i <= 50; i++ {
			payloads = append(payloads, order(i))
		}
		publish(t, db, store, "orders", "OrderPlaced", payloads...)
		waitFor(t, "every event handled by both", func() bool {
			return len(held.snapshot()) == 50 && len(inTx.snapshot()) == 50
		})
		time.Sleep(100 * time.Millisecond) // let any duplicate show
		for name, c := range map[string]*counter{"held": held, "in-tx": inTx} {
			for id, n := range c.snapshot() {
				if n != 1 {
					t.Errorf("%s handled order %d %d times", name, id, n)
				}
			}
		}
		if heldRefused.Load() == 0 {
			t.Error("no delivery of the WithHoldClaims handler came from a held claim")
		}
		if n := inTxErrors.Load(); n != 0 {
			t.Errorf("%d acknowledgements in the handler's transaction failed for the handler without the option", n)
		}
	})
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		store := testdb.New(t, "sqlite").Store(t)
		_, err := bus.New(store, bus.Config{}, handlers.New("held", "orders", "OrderPlaced",
			func(context.Context, orderPlaced, handlers.Meta) error { return nil }, handlers.WithHoldClaims()))
		if !errors.Is(err, errors.ErrUnsupported) {
			t.Fatalf("WithHoldClaims on SQLite: want errors.ErrUnsupported, got %v", err)
		}
	})
}

// TestStopAfterAFailedStart: when Start fails because the router's run
// failed (here a subscriber's schema check), Stop returns nil at once. It
// used to close a router Watermill never ran, waiting for handlers that
// never started until the close timeout, and return a timeout error.
func TestStopAfterAFailedStart(t *testing.T) {
	db := testdb.New(t, "postgres")
	store := db.Store(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, "ALTER TABLE millpond_deliveries DROP COLUMN settled CASCADE"); err != nil {
		t.Fatal(err)
	}
	h := handlers.New("reserve-stock", "orders", "OrderPlaced", func(context.Context, orderPlaced, handlers.Meta) error { return nil })
	b, err := bus.New(store, bus.Config{Subscriber: fastSubscriber}, h)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx); !errors.Is(err, outbox.ErrSchemaOutdated) {
		t.Fatalf("Start: %v, want ErrSchemaOutdated", err)
	}
	sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	began := time.Now()
	if err := b.Stop(sctx); err != nil || time.Since(began) > time.Second {
		t.Fatalf("Stop after a failed Start took %s and returned %v; want nil at once", time.Since(began), err)
	}
}
