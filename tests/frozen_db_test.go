package tests

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/outbox/postgres"
)

// frozenEnv is a migrated PostgreSQL schema and a store that reaches it
// through a freezeProxy; e reaches it directly, to look at the rows while
// the proxy is frozen.
type frozenEnv struct {
	*env
	proxy *freezeProxy
	pool  *pgxpool.Pool
	store *outbox.Store
}

func newFrozenEnv(t *testing.T) *frozenEnv {
	t.Helper()
	e := newEnv(t, "postgres", false)
	target := strings.TrimPrefix(strings.SplitN(strings.TrimPrefix(testdb.PostgresURL(), "postgres://"), "/", 2)[0], "postgres@")
	proxy := newFreezeProxy(t, target)
	pool, err := pgxpool.New(context.Background(), proxy.via(t, e.db.URL)+"&pool_max_conns=8")
	if err != nil {
		t.Fatal(err)
	}
	store, err := postgres.New(pool, outbox.WithoutListen())
	if err != nil {
		t.Fatal(err)
	}
	// The proxy thaws first (cleanups run last in, first out), so whatever
	// still waits on the database ends.
	t.Cleanup(func() { _ = store.Close(); pool.Close() })
	t.Cleanup(proxy.unfreeze)
	return &frozenEnv{env: e, proxy: proxy, pool: pool, store: store}
}

// within runs f and fails the test if it has not returned after limit.
func within(t *testing.T, limit time.Duration, what string, f func()) time.Duration {
	t.Helper()
	start := time.Now()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
		return time.Since(start)
	case <-time.After(limit):
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		t.Fatalf("%s has not returned after %s while the database does not answer\n%s", what, limit, buf)
		return 0
	}
}

// TestHeldSubscriberCloseWithFrozenDatabase: a Subscriber with HoldClaims
// closed while its database does not answer (a hung host, a network that
// drops packets) ends its held batches within a statement's bound: Close
// returns, and so does closing the store and its pool, whose connections
// the batches' transactions must give back rather than wait on a
// rollback that never returns.
func TestHeldSubscriberCloseWithFrozenDatabase(t *testing.T) {
	f := newFrozenEnv(t)
	evs := make([]outbox.Event, 10)
	for i := range evs {
		evs[i] = event("frozen", "k"+string(rune('a'+i)))
	}
	f.enqueueAll(evs...)
	// Nobody reads the channel: the batch is claimed and held, its
	// messages wait for a reader.
	sub, err := outbox.NewSubscriber(f.store, outbox.SubscriberConfig{
		HoldClaims: true, HoldClaimsAfter: -1, Lease: 9 * time.Second, BatchSize: 10,
		CloseTimeout: 100 * time.Millisecond, PollInterval: 10 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sub.Subscribe(context.Background(), "frozen"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the batch to be held", func() bool { return f.lockedRows("frozen") == 10 })
	f.proxy.freeze()

	// A statement of the subscription waits at most max(Lease/2, 5 s).
	took := within(t, 20*time.Second, "Subscriber.Close", func() { _ = sub.Close() })
	t.Logf("Close took %s", took)
	// A connection the driver drops sends the server a cancel request
	// first, for at most 15 s (pgx's own bound).
	within(t, 25*time.Second, "Store.Close and closing the pool", func() {
		_ = f.store.Close()
		f.pool.Close()
	})
}

// TestSubscriberCloseWithFrozenDatabase: a leased Subscriber closed while
// its database does not answer returns after its statements' bounds
// (max(Lease/2, 5 s) each: the release of what it claimed, the write of
// its pending acks), not after one bound per 250 events it holds: the
// lease extender must not go on renewing, chunk after chunk, the leases of
// a subscription that has ended.
func TestSubscriberCloseWithFrozenDatabase(t *testing.T) {
	f := newFrozenEnv(t)
	closeLeasedWhileFrozen(t, f.env, f.store, f.proxy)
}

// frozenEvents is how many events closeLeasedWhileFrozen enqueues.
const frozenEvents = 1000

// closeLeasedWhileFrozen has a leased Subscriber over store (which reaches
// e's database through proxy) claim 1,000 events, acknowledge 3 and hold
// one more unsettled, lets a lease extension round start, freezes the proxy
// and closes the Subscriber: Close must return within two statement bounds
// and a margin. It returns how many of the events it acknowledged.
func closeLeasedWhileFrozen(t *testing.T, e *env, store *outbox.Store, proxy *freezeProxy) int {
	t.Helper()
	const n = frozenEvents
	enqueueMany(t, e.db, e.s, "frozen", "ev", n)
	sub, err := outbox.NewSubscriber(store, outbox.SubscriberConfig{
		Lease: 9 * time.Second, BatchSize: n, MaxInFlight: 4,
		CloseTimeout: 100 * time.Millisecond, PollInterval: 10 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := sub.Subscribe(context.Background(), "frozen")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the events to be claimed", func() bool {
		return e.count("SELECT COUNT(*) FROM millpond_deliveries WHERE stream = ? AND status = 'processing'", "frozen") >= n-100
	})
	const acked = 3
	for range acked {
		(<-msgs).Ack()
	}
	<-msgs // handed out, never settled
	// Let the extender start a round, then freeze.
	time.Sleep(3100 * time.Millisecond)
	proxy.freeze()
	took := within(t, 40*time.Second, "Subscriber.Close", func() { _ = sub.Close() })
	t.Logf("Close took %s", took)
	if limit := 2*5*time.Second + 3*time.Second; took > limit {
		t.Fatalf("Close took %s while the database did not answer, want at most %s", took, limit)
	}
	return acked
}

// TestCloseEndsASubscribeWaitingForAFrozenDatabase: a Subscribe whose
// database does not answer (its schema check waits) must not hold up the
// Subscriber's Close, which a Router calls on shutdown: Close returns at
// once, and the Subscribe returns ErrClosed.
func TestCloseEndsASubscribeWaitingForAFrozenDatabase(t *testing.T) {
	f := newFrozenEnv(t)
	sub, err := outbox.NewSubscriber(f.store, outbox.SubscriberConfig{CloseTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	f.proxy.freeze()
	subscribed := make(chan error, 1)
	go func() {
		_, err := sub.Subscribe(context.Background(), "frozen")
		subscribed <- err
	}()
	// Let Subscribe reach the database and wait there.
	select {
	case err := <-subscribed:
		t.Fatalf("Subscribe returned while the database does not answer: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	within(t, 5*time.Second, "Subscriber.Close while Subscribe waits for the database", func() { _ = sub.Close() })
	select {
	case err := <-subscribed:
		if !errors.Is(err, outbox.ErrClosed) {
			t.Errorf("Subscribe ended by Close: %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Subscribe still waits for the database 5 s after Close")
	}
}

// TestStatsQueryOnAFrozenDatabaseHoldsUpNoOne: a CachedStats query waiting
// for a database that does not answer (a caller without a deadline) holds
// up neither another CachedStats, which gives up when its own context ends
// (bus.Health's, bounded by PingTimeout, behind a Prometheus scrape's), nor
// a Subscribe that needs no database (SkipRegistration, schema checked),
// which would otherwise wait under the Subscriber's lock and hold up Close.
func TestStatsQueryOnAFrozenDatabaseHoldsUpNoOne(t *testing.T) {
	f := newFrozenEnv(t)
	ctx := context.Background()
	if err := f.store.CheckSchema(ctx); err != nil {
		t.Fatal(err)
	}
	sub, err := outbox.NewSubscriber(f.store, outbox.SubscriberConfig{SkipRegistration: true, CloseTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	f.proxy.freeze()
	hung := make(chan struct{})
	go func() {
		defer close(hung)
		_, _, _ = f.store.CachedStats(ctx)
	}()
	time.Sleep(300 * time.Millisecond) // the query waits on the frozen database
	select {
	case <-hung:
		t.Fatal("CachedStats returned while the database does not answer")
	default:
	}

	within(t, 3*time.Second, "CachedStats with a 300 ms context behind a hung one", func() {
		sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		if _, _, err := f.store.CachedStats(sctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("CachedStats behind a hung query: %v, want context.DeadlineExceeded", err)
		}
	})
	within(t, 3*time.Second, "Subscribe (SkipRegistration) while a Stats query hangs", func() {
		if _, err := sub.Subscribe(ctx, "frozen"); err != nil {
			t.Errorf("Subscribe: %v", err)
		}
	})
	f.proxy.unfreeze()
	within(t, 15*time.Second, "Subscriber.Close once the database answers", func() { _ = sub.Close() })
	<-hung
}
