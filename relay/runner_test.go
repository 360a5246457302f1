package relay_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/relay"
)

// recordingPublisher records every message; publishes of the keys in slow
// wait for release (or 3 s) first.
type recordingPublisher struct {
	mu      sync.Mutex
	got     map[string]int
	slow    map[string]bool
	release chan struct{}
	started atomic.Int64 // slow publishes started
}

func newRecordingPublisher(slow ...string) *recordingPublisher {
	p := &recordingPublisher{got: map[string]int{}, slow: map[string]bool{}, release: make(chan struct{})}
	for _, k := range slow {
		p.slow[k] = true
	}
	return p
}

func (p *recordingPublisher) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if p.slow[m.UUID] {
			p.started.Add(1)
			select {
			case <-p.release:
			case <-time.After(3 * time.Second):
			}
		}
		p.mu.Lock()
		p.got[m.UUID]++
		p.mu.Unlock()
	}
	return nil
}

func (p *recordingPublisher) Close() error { return nil }

func (p *recordingPublisher) count(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.got[key]
}

// relayFixture is a PostgreSQL store with the relay's group registered
// and n events (e0, e1, ...) of stream s enqueued, and a recording
// publisher holding the publishes of slow.
func relayFixture(t *testing.T, n int, slow ...string) (*testdb.Database, *outbox.Store, *recordingPublisher) {
	t.Helper()
	db := testdb.New(t, "postgres")
	store := db.Store(t)
	if err := store.RegisterGroup(context.Background(), "s", relay.DefaultGroup); err != nil {
		t.Fatal(err)
	}
	enqueue(t, db, store, events(n)...)
	return db, store, newRecordingPublisher(slow...)
}

func events(n int) []outbox.Event {
	var evs []outbox.Event
	for i := range n {
		evs = append(evs, outbox.Event{Stream: "s", Key: fmt.Sprintf("e%d", i), Kind: "K", Payload: []byte("x")})
	}
	return evs
}

// TestLeaseExtendedWhilePublishing: with a 1 s lease, a publish that takes
// 3 s keeps its claim, so the event is neither claimed again nor published
// twice: under leases the relay extends the lease every Lease/3; a held
// claim (PostgreSQL's default) stays open for at least four times the
// publish timeout.
func TestLeaseExtendedWhilePublishing(t *testing.T) {
	for _, useLeases := range []bool{true, false} {
		t.Run(map[bool]string{true: "Leases", false: "Held"}[useLeases], func(t *testing.T) {
			t.Parallel()
			db, store, pub := relayFixture(t, 5, "e1")
			w, err := relay.NewWatermill(store, pub, relay.WatermillConfig{Config: relay.Config{Streams: []string{"s"}, Window: 4,
				Lease: time.Second, PollInterval: 20 * time.Millisecond, UseLeases: useLeases}})
			if err != nil {
				t.Fatal(err)
			}
			runUntil(t, w.Run, delivered(t, db, 5))
			if n := pub.count("e1"); n != 1 {
				t.Errorf("the slow event was published %d times, want 1", n)
			}
			if n := db.Count(t, "SELECT count(*) FROM millpond_outbox WHERE consumer_group = 'relay' AND attempts <> 1"); n != 0 {
				t.Errorf("%d events were claimed more than once", n)
			}
		})
	}
}

// TestStopReleasesUnpublishedAndSettlesInFlight: a relay stopped while a
// publish is in flight waits for it (within CloseTimeout) and acknowledges
// it, and hands the events it claimed but did not publish back at once,
// without counting an attempt.
func TestStopReleasesUnpublishedAndSettlesInFlight(t *testing.T) {
	db := testdb.New(t, "postgres")
	store := db.Store(t)
	ctx := context.Background()
	if err := store.RegisterGroup(ctx, "s", relay.DefaultGroup); err != nil {
		t.Fatal(err)
	}
	enqueue(t, db, store, events(10)...)
	pub := newRecordingPublisher("e0")
	w, err := relay.NewWatermill(store, pub, relay.WatermillConfig{Config: relay.Config{Streams: []string{"s"}, Window: 1,
		Lease: time.Minute, CloseTimeout: 5 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	deadline := time.Now().Add(10 * time.Second)
	for pub.started.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the first publish did not start")
		}
		time.Sleep(5 * time.Millisecond)
	}
	stop()
	time.Sleep(200 * time.Millisecond)
	close(pub.release) // the publish in flight completes after the stop
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := db.Count(t, "SELECT count(*) FROM millpond_outbox WHERE consumer_group = 'relay' AND event_key = 'e0' AND status = 'delivered'"); n != 1 {
		t.Error("the event published during the stop was not acknowledged")
	}
	if n := db.Count(t, "SELECT count(*) FROM millpond_outbox WHERE consumer_group = 'relay' AND status = 'pending' AND attempts = 0"); n != 9 {
		t.Errorf("%d events pending with no attempt counted, want the 9 claimed but not published", n)
	}
	if s := w.Stats(); s.Published != 1 {
		t.Errorf("stats %+v, want 1 published", s)
	}
}

// TestIdleRelayWokenByNotification: an idle relay polls less and less
// often (up to PollInterval, an hour here), but an event committed by
// another process's store reaches it at once through PostgreSQL's
// notification (Store.Watch).
func TestIdleRelayWokenByNotification(t *testing.T) {
	db := testdb.New(t, "postgres")
	relayStore, producer := db.Store(t), db.Store(t)
	if listening, _ := relayStore.ListenerStatus(); !listening {
		t.Fatal("the test store does not listen for notifications")
	}
	ctx := context.Background()
	if err := relayStore.RegisterGroup(ctx, "s", relay.DefaultGroup); err != nil {
		t.Fatal(err)
	}
	pub := newRecordingPublisher()
	w, err := relay.NewWatermill(relayStore, pub, relay.WatermillConfig{Config: relay.Config{Streams: []string{"s"}, PollInterval: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	// Idle for 6 s: its polls back off (1 ms doubling: the last one near
	// 4.1 s, the next near 8.2 s).
	time.Sleep(6 * time.Second)
	enqueue(t, db, producer, outbox.Event{Stream: "s", Key: "late", Kind: "K", Payload: []byte("x")})
	start := time.Now()
	for pub.count("late") == 0 {
		if time.Since(start) > time.Second {
			t.Fatal("the committed event was not relayed within 1 s: the notification did not wake the relay")
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("relayed %s after the commit", time.Since(start).Round(time.Millisecond))
}

// TestClaimsRampUpOverABacklog: a relay over a backlog claims a few events
// first and doubles its claims while they come back full, so the first
// events are published before a whole batch is claimed: with Window 512
// the first claim takes 32 events, and over a backlog of 224 (32 + 64 +
// 128) no claim takes more than 128, never the BatchSize. (The rows of one
// claim share their lease's expiry, or on PostgreSQL, whose claims are
// held, their delivery time, which tells the claims apart.)
func TestClaimsRampUpOverABacklog(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, dialect)
			store := db.Store(t)
			if err := store.RegisterGroup(context.Background(), "s", relay.DefaultGroup); err != nil {
				t.Fatal(err)
			}
			const backlog = 32 + 64 + 128
			enqueue(t, db, store, events(backlog)...)
			pub := newRecordingPublisher()
			w, err := relay.NewWatermill(store, pub, relay.WatermillConfig{Config: relay.Config{Streams: []string{"s"}, Window: 512,
				BatchSize: 1000, PollInterval: 20 * time.Millisecond}})
			if err != nil {
				t.Fatal(err)
			}
			runUntil(t, w.Run, delivered(t, db, backlog))
			const rows = "FROM millpond_outbox WHERE consumer_group = 'relay'"
			col := "available_at"
			if dialect == "postgres" {
				col = "delivered_at"
			}
			first := db.Count(t, "SELECT count(*) "+rows+" AND "+col+" = (SELECT "+col+" "+rows+" ORDER BY id LIMIT 1)")
			claims := db.Count(t, "SELECT count(DISTINCT "+col+") "+rows)
			largest := db.Count(t, "SELECT max(n) FROM (SELECT count(*) AS n "+rows+" GROUP BY "+col+") c")
			if first != 32 || claims != 3 || largest != 128 {
				t.Errorf("the first claim took %d events, %d claims the largest %d; want 32, 3 (32, 64, 128), 128", first, claims, largest)
			}
		})
	}
}

// TestRunRefusesAnOutdatedSchema: a relay started before the database's
// migrations ran returns ErrSchemaOutdated at once instead of failing
// every claim.
func TestRunRefusesAnOutdatedSchema(t *testing.T) {
	db := testdb.New(t, "postgres")
	store := db.Store(t)
	db.Exec(t, "ALTER TABLE millpond_deliveries DROP COLUMN key_released CASCADE") // and the view over it
	w, err := relay.NewWatermill(store, newRecordingPublisher(), relay.WatermillConfig{Config: relay.Config{Streams: []string{"s"}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.Run(ctx); !errors.Is(err, outbox.ErrSchemaOutdated) || !strings.Contains(err.Error(), "millpond_deliveries.key_released") {
		t.Fatalf("Run = %v, want ErrSchemaOutdated naming the missing column", err)
	}
}

// TestHeldClaimsOnPostgres: on PostgreSQL a relay holds the batch it
// publishes in a transaction (outbox.Store.ClaimHeld): while a publish is
// in flight its events' rows are unchanged (pending, no attempt counted)
// yet no other claim can take them, and each is written once, delivered at
// its first attempt. With UseLeases they are claimed under leases
// (processing) as on other databases.
func TestHeldClaimsOnPostgres(t *testing.T) {
	for _, useLeases := range []bool{false, true} {
		t.Run(map[bool]string{false: "Held", true: "Leases"}[useLeases], func(t *testing.T) {
			t.Parallel()
			db, store, pub := relayFixture(t, 5, "e0")
			ctx := context.Background()
			w, err := relay.NewWatermill(store, pub, relay.WatermillConfig{Config: relay.Config{Streams: []string{"s"}, Window: 5,
				PollInterval: 20 * time.Millisecond, UseLeases: useLeases}})
			if err != nil {
				t.Fatal(err)
			}
			runCtx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- w.Run(runCtx) }()
			for deadline := time.Now().Add(10 * time.Second); pub.started.Load() == 0; {
				if time.Now().After(deadline) {
					t.Fatal("the first publish did not start")
				}
				time.Sleep(5 * time.Millisecond)
			}
			processing := db.Count(t, "SELECT count(*) FROM millpond_outbox WHERE consumer_group = 'relay' AND status = 'processing'")
			other, err := store.Claim(ctx, outbox.ClaimRequest{Stream: "s", Group: relay.DefaultGroup, Worker: "other", Limit: 10,
				Lease: time.Minute, MaxAttempts: 5})
			if err != nil {
				t.Fatal(err)
			}
			if len(other) != 0 {
				t.Errorf("another claim took %d events the relay held", len(other))
			}
			switch {
			case !useLeases && processing != 0:
				t.Errorf("held claims: %d rows processing while the batch was published, want none written", processing)
			case useLeases && processing == 0:
				t.Error("UseLeases: no row processing while the batch was published")
			}
			close(pub.release)
			for deadline := time.Now().Add(20 * time.Second); db.Count(t, "SELECT count(*) FROM millpond_outbox WHERE consumer_group = 'relay' AND status = 'delivered' AND attempts = 1") != 5; {
				if time.Now().After(deadline) {
					t.Fatal("the 5 events were not all delivered at their first attempt")
				}
				time.Sleep(10 * time.Millisecond)
			}
			stop()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestStopSettlesHeldBatchWithoutUnconfirmed: a relay with held claims
// stopped while a publish stays unconfirmed past CloseTimeout settles its
// batch without that event: the confirmed events are delivered, the
// unconfirmed one and the batch waiting behind it are left due, unchanged
// (pending, no attempt counted), and Run returns without waiting for the
// slow publish.
func TestStopSettlesHeldBatchWithoutUnconfirmed(t *testing.T) {
	db, store, pub := relayFixture(t, 5, "e0") // e0 held for 3 s
	ctx := context.Background()
	w, err := relay.NewWatermill(store, pub, relay.WatermillConfig{Config: relay.Config{Streams: []string{"s"}, Window: 4,
		CloseTimeout: 300 * time.Millisecond, PollInterval: 20 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	for deadline := time.Now().Add(10 * time.Second); pub.started.Load() == 0 || pub.count("e1")+pub.count("e2")+pub.count("e3") < 3; {
		if time.Now().After(deadline) {
			t.Fatal("the first batch was not published")
		}
		time.Sleep(5 * time.Millisecond)
	}
	stopped := time.Now()
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if took := time.Since(stopped); took > 2*time.Second {
		t.Errorf("Run returned %v after the stop, want about the close timeout", took)
	}
	const rows = "SELECT count(*) FROM millpond_outbox WHERE consumer_group = 'relay' AND "
	if n := db.Count(t, rows+"event_key IN ('e1', 'e2', 'e3') AND status = 'delivered' AND attempts = 1"); n != 3 {
		t.Errorf("%d of the 3 confirmed events delivered", n)
	}
	if n := db.Count(t, rows+"event_key IN ('e0', 'e4') AND status = 'pending' AND attempts = 0"); n != 2 {
		t.Errorf("%d of the unconfirmed and the unpublished event left pending and unchanged, want 2", n)
	}
}

// TestWatermillPublishTimeout: a Watermill publish that does not return
// within PublishTimeout counts as a failed publish (reason timeout) and
// the event is retried, so a hung publisher neither fills the window nor
// keeps a held batch open; the late return changes nothing.
func TestWatermillPublishTimeout(t *testing.T) {
	db, store, _ := relayFixture(t, 3)
	pub := &pacedPublisher{stall: "e0", stalling: make(chan struct{}), stalled: make(chan struct{})}
	w, err := relay.NewWatermill(store, pub, relay.WatermillConfig{Config: relay.Config{Streams: []string{"s"},
		PublishTimeout: 300 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, PollInterval: 20 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, w.Run, delivered(t, db, 3))
	if at := pub.positions("e0"); len(at) != 1 {
		t.Errorf("e0 recorded at %v, want once (the retry; the stalled publish has not returned)", at)
	}
	close(pub.stalled) // the first publish of e0 returns now, after its retry was delivered
	if s := w.Stats(); s.Failed != 1 || s.Published != 3 {
		t.Errorf("stats %+v, want 1 failed (the timeout) and 3 published", s)
	}
	if n := db.Count(t, "SELECT count(*) FROM millpond_outbox WHERE consumer_group = 'relay' AND event_key = 'e0' AND attempts = 2"); n != 1 {
		t.Error("e0 was not delivered at its second attempt")
	}
}
