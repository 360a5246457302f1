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
// keys in failOnce, and records the keys it published, in order.
type pacedPublisher struct {
	pace     time.Duration
	mu       sync.Mutex
	failOnce map[string]bool
	order    []string
}

func (p *pacedPublisher) Publish(_ string, msgs ...*message.Message) error {
	time.Sleep(p.pace)
	p.mu.Lock()
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

// backlogRelay relays evs (and a backlog of 2,000 more after them) at
// about 2,000 events/s, one claimer taking batches of 4, with claim bounds
// that would live an hour: only what the relay learns itself (a retry
// coming due, an acknowledged ordered head) makes its claims go back below
// the bound before the backlog ends.
func backlogRelay(t *testing.T, pub *pacedPublisher, evs ...outbox.Event) {
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
	w, err := relay.NewWatermill(store, pub, relay.WatermillConfig{Config: relay.Config{Streams: []string{"s"}, Window: 4, BatchSize: 4,
		MaxBackoff: 50 * time.Millisecond, PollInterval: 20 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
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
