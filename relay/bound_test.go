package relay_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/relay"
)

// pacedPublisher takes pace per publish, fails the first publish of the
// keys in failOnce, holds the first publish of the key stall until stalled
// is closed (signalling stalling when it starts), and records the keys it
// published, in order.
type pacedPublisher struct {
	pace     time.Duration
	stall    string
	stalling chan struct{}
	stalled  chan struct{}
	mu       sync.Mutex
	failOnce map[string]bool
	order    []string
}

func (p *pacedPublisher) Publish(_ string, msgs ...*message.Message) error {
	time.Sleep(p.pace)
	p.mu.Lock()
	if len(msgs) == 1 && msgs[0].UUID == p.stall && p.stalling != nil {
		started := p.stalling
		p.stalling = nil
		p.mu.Unlock()
		close(started)
		<-p.stalled
		p.mu.Lock()
	}
	defer p.mu.Unlock()
	for _, m := range msgs {
		if p.failOnce[m.UUID] {
			delete(p.failOnce, m.UUID)
			return errors.New("broker hiccup")
		}
		p.order = append(p.order, m.UUID)
	}
	return nil
}

func (p *pacedPublisher) Close() error { return nil }

// position is where key was published among all publishes (-1: never).
func (p *pacedPublisher) position(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Index(p.order, key)
}

// positions is where key was published each time.
func (p *pacedPublisher) positions(key string) []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	var at []int
	for i, k := range p.order {
		if k == key {
			at = append(at, i)
		}
	}
	return at
}

// backlogRelay relays evs (and a backlog of 2,000 more after them) at
// about 2,000 events/s, one claimer taking batches of 4, with claim bounds
// that would live an hour: only what the relay learns itself (a retry
// coming due, an acknowledged ordered head) makes its claims go back below
// the bound before the backlog ends.
func backlogRelay(t *testing.T, pub *pacedPublisher, evs ...outbox.Event) {
	backlogRelayWith(t, pub, nil, evs...)
}

// backlogRelayWith is backlogRelay calling during (if not nil) on a
// goroutine of its own while the relay runs, with its claims under leases
// of 1 s (not held).
func backlogRelayWith(t *testing.T, pub *pacedPublisher, during func(db *testdb.Database), evs ...outbox.Event) {
	t.Cleanup(relay.SetMaxBoundAge(time.Hour))
	db := testdb.New(t, "postgres")
	store := db.Store(t)
	if err := store.RegisterGroup(context.Background(), "s", relay.DefaultGroup); err != nil {
		t.Fatal(err)
	}
	const backlog = 2000
	for i := range backlog {
		evs = append(evs, outbox.Event{Stream: "s", Key: fmt.Sprintf("b%d", i), Kind: "K", Payload: []byte("x")})
	}
	enqueue(t, db, store, evs...)
	cfg := relay.Config{Streams: []string{"s"}, Window: 4, BatchSize: 4, MaxBackoff: 50 * time.Millisecond, PollInterval: 20 * time.Millisecond}
	if during != nil {
		// The caller makes a lease expire: a claim under a lease it is.
		cfg.Lease, cfg.UseLeases = time.Second, true
	}
	w, err := relay.NewWatermill(store, pub, relay.WatermillConfig{Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	if during != nil {
		go during(db)
	}
	runUntil(t, w.Run, delivered(t, db, int64(len(evs))))
}

// TestRetriedEventBelowClaimBound: an event whose publish failed is
// retried once its backoff has passed, while the relay still works through
// the backlog above the claim bound its full claims set: among the first
// quarter of the publishes, not at the end of the backlog.
func TestRetriedEventBelowClaimBound(t *testing.T) {
	pub := &pacedPublisher{pace: 2 * time.Millisecond, failOnce: map[string]bool{"first": true}}
	backlogRelay(t, pub, outbox.Event{Stream: "s", Key: "first", Kind: "K", Payload: []byte("x")})
	if at, n := pub.position("first"), len(pub.order); at < 0 || at > n/4 {
		t.Fatalf("the retried event was published %dth of %d", at+1, n)
	}
}

// TestOrderedEventsBelowClaimBound: the next events of an ordering key,
// claimable once the relay acknowledged their heads, are relayed while the
// relay still works through the backlog above its claim bound.
func TestOrderedEventsBelowClaimBound(t *testing.T) {
	pub := &pacedPublisher{pace: 2 * time.Millisecond}
	var evs []outbox.Event
	for i := range 3 {
		evs = append(evs, outbox.Event{Stream: "s", Key: fmt.Sprintf("o%d", i), Kind: "K", Payload: []byte("x"), OrderingKey: "order-1"})
	}
	backlogRelay(t, pub, evs...)
	for i, key := range []string{"o0", "o1", "o2"} {
		if at, n := pub.position(key), len(pub.order); at < 0 || at > n/4 || (i > 0 && at < pub.position(evs[i-1].Key)) {
			t.Fatalf("ordered event %d was published %dth of %d", i, at+1, n)
		}
	}
}

// TestExpiredLeaseBelowClaimBound: an event whose lease the relay lost
// while publishing it (its lease made to expire here) is claimed again as
// soon as the lease extender finds the loss (within Lease/3), while the
// relay still works through the backlog above its claim bound, not at its
// end.
func TestExpiredLeaseBelowClaimBound(t *testing.T) {
	// Publish clears pub.stalling under its lock: wait on the channel
	// itself, not on the field.
	stalling := make(chan struct{})
	pub := &pacedPublisher{pace: 2 * time.Millisecond, stall: "first", stalling: stalling, stalled: make(chan struct{})}
	expire := func(db *testdb.Database) {
		<-stalling
		db.Exec(t, "UPDATE millpond_deliveries SET available_at = 0 WHERE event_id = (SELECT id FROM millpond_events WHERE event_key = 'first')")
		// The first publish ends once the event was published again.
		for deadline := time.Now().Add(10 * time.Second); pub.position("first") < 0 && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
		close(pub.stalled)
	}
	backlogRelayWith(t, pub, expire, outbox.Event{Stream: "s", Key: "first", Kind: "K", Payload: []byte("x")})
	at, n := pub.positions("first"), len(pub.order)
	if len(at) == 0 || at[0] > n/2 {
		t.Fatalf("the event whose lease expired was published again at %v of %d publishes", at, n)
	}
}
