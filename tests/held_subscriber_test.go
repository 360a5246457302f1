package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
	mysqlstore "github.com/millpond/millpond/outbox/mysql"
	"github.com/millpond/millpond/outbox/postgres"
)

// TestSubscriberHoldClaims checks a Subscriber with HoldClaims on
// PostgreSQL and MariaDB: its events stay unchanged and locked while their
// messages are handled, each acked event's row is written once (delivered
// at attempt 1), nacked events are retried and dead-lettered as usual, a
// closed subscriber leaves what it did not settle due at once, a slow
// handler's batch is settled early and its event leased, a batch whose
// transaction died hands out nothing more, and ordered events keep their
// order.
func TestSubscriberHoldClaims(t *testing.T) {
	for _, dialect := range []string{"postgres", "mysql"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			testSubscriberHoldClaims(t, dialect)
		})
	}
}

func testSubscriberHoldClaims(t *testing.T, dialect string) {
	for name, run := range map[string]func(*testing.T, *env){
		"DeliversEachEventOnce":      testHeldSubDelivers,
		"NackRetriesThenDeadLetter":  testHeldSubNack,
		"CloseLeavesUnsettledDue":    testHeldSubClose,
		"SlowHandlerIsLeased":        testHeldSubSlowHandler,
		"LostBatchLeavesItsQueue":    testHeldSubLostBatch,
		"SlowBatchesDoNotStopClaims": testHeldSubSlotsFull,
		"OrderedKeysInSequence":      testHeldSubOrdered,
		"NoReceiptForTransactions":   testHeldSubNoReceipt,
		"LeasesUntilHoldClaimsAfter": testHeldSubLeasesFirst,
		"RetryDuringBacklog":         testHeldSubRetryDuringBacklog,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, dialect, false)
			e.s = poolStore(t, e.db, 12) // room for 3 held claims
			run(t, e)
		})
	}
	t.Run("MetricsCountHeldBatches", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, dialect, false)
		rig := newTelemetryRig(t)
		e.s = poolStore(t, e.db, 12, rig.options()...)
		testHeldSubMetrics(t, e, rig)
	})
	t.Run("StoreBudgetFallsBackToLeases", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, dialect, false)
		e.s = poolStore(t, e.db, 4) // room for 1 held claim
		testHeldSubBudget(t, e)
	})
}

// poolStore opens a store of its own on db's schema or database over a
// pool of maxConns connections (a store holds claims on at most a
// quarter).
func poolStore(t *testing.T, db *testdb.Database, maxConns int, opts ...outbox.Option) *outbox.Store {
	t.Helper()
	if db.Dialect == "mysql" {
		return mysqlStoreAt(t, db.URL, maxConns, opts...)
	}
	pool, err := pgxpool.New(context.Background(), db.URL+"&pool_max_conns="+strconv.Itoa(maxConns))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := postgres.New(pool, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// mysqlStoreAt opens a store of its own over a *sql.DB of the MySQL URL
// (parameters as mysqlstore.DSN reads them) with at most maxConns
// connections (0: no limit); both are closed at the end of the test.
func mysqlStoreAt(t *testing.T, url string, maxConns int, opts ...outbox.Option) *outbox.Store {
	t.Helper()
	dsn, err := mysqlstore.DSN(url)
	if err != nil {
		t.Fatal(err)
	}
	sqlDB, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sqlDB.Close() })
	sqlDB.SetMaxOpenConns(maxConns)
	s, err := mysqlstore.New(sqlDB, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestSubscriberHoldClaimsUnsupported: SQLite holds no claims.
func TestSubscriberHoldClaimsUnsupported(t *testing.T) {
	e := newEnv(t, "sqlite", false)
	sub, err := outbox.NewSubscriber(e.s, outbox.SubscriberConfig{HoldClaims: true})
	if !errors.Is(err, errors.ErrUnsupported) || sub != nil {
		t.Fatalf("HoldClaims on SQLite: want errors.ErrUnsupported, got %v", err)
	}
}

// heldSubscribe subscribes a holding Subscriber to stream; it is closed at
// the end of the test.
func heldSubscribe(t *testing.T, e *env, stream string, cfg outbox.SubscriberConfig) (*outbox.Subscriber, <-chan *message.Message) {
	t.Helper()
	cfg.HoldClaims = true
	if cfg.HoldClaimsAfter == 0 {
		cfg.HoldClaimsAfter = -1 // held from the first claim
	}
	return subscribe(t, e.s, cfg, stream)
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// lockedRows counts the stream's delivery rows another transaction cannot
// lock now.
func (e *env) lockedRows(stream string) int64 {
	e.t.Helper()
	raw, _, rollback := e.db.BeginRaw(e.t)
	defer rollback()
	var free int64
	var err error
	switch tx := raw.(type) {
	case pgx.Tx:
		err = tx.QueryRow(e.ctx, `SELECT COUNT(*) FROM (SELECT id FROM millpond_deliveries WHERE stream = $1 FOR UPDATE SKIP LOCKED) f`, stream).Scan(&free)
	case *sql.Tx:
		// Through the primary key, as the claims lock rows.
		err = tx.QueryRowContext(e.ctx, `SELECT COUNT(*) FROM (SELECT id FROM millpond_deliveries FORCE INDEX (PRIMARY) WHERE stream = ? FOR UPDATE SKIP LOCKED) f`, stream).Scan(&free)
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return e.count("SELECT COUNT(*) FROM millpond_deliveries WHERE stream = ?", stream) - free
}

func testHeldSubDelivers(t *testing.T, e *env) {
	const n = 300
	evs := keyedEvents("held", n)
	e.enqueueAll(evs...)
	_, msgs := heldSubscribe(t, e, "held", outbox.SubscriberConfig{BatchSize: 100, MaxInFlight: 4})

	first := receive(t, msgs, 10*time.Second)
	// While it is handled its batch is held: every row is as enqueued
	// (no lease written, no attempt counted) and its rows are locked.
	if w := e.count("SELECT COUNT(*) FROM millpond_deliveries WHERE stream = 'held' AND (status <> 'pending' OR attempts <> 0)"); w != 0 {
		t.Fatalf("%d rows written while their messages are handled, want 0", w)
	}
	if l := e.lockedRows("held"); l == 0 {
		t.Fatal("no row is locked while its message is handled")
	}
	seen := map[string]int{first.UUID: 1}
	first.Ack()
	for len(seen) < n {
		m := receive(t, msgs, 10*time.Second)
		seen[m.UUID]++
		if a := m.Metadata.Get(outbox.MetadataAttempt); a != "1" {
			t.Errorf("message %s: attempt %s, want 1", m.UUID, a)
		}
		m.Ack()
	}
	expectNothing(t, msgs, 300*time.Millisecond)
	for key, k := range seen {
		if k != 1 {
			t.Errorf("%s delivered %d times", key, k)
		}
	}
	// Every row delivered at its first attempt. (Not every batch need
	// have been held: when none of the subscription's held batches
	// settles within heldSlotWait, as on a loaded machine, the next batch
	// is claimed under a lease, and a leased acknowledgement keeps the
	// row's claim key.)
	waitFor(t, "every row delivered at attempt 1", func() bool {
		return e.count("SELECT COUNT(*) FROM millpond_deliveries WHERE stream = 'held' AND status = 'delivered' AND attempts = 1 AND delivered_at IS NOT NULL") == n
	})
	// The first message's batch was held (checked above) and the message
	// acked while it was: its row was settled by the held claim, written
	// once, never under a lease (no claim key).
	if k := e.count("SELECT COUNT(*) FROM millpond_deliveries d JOIN millpond_events v ON v.id = d.event_id WHERE d.stream = 'held' AND v.event_key = ? AND d.status = 'delivered' AND d.claim_key = ''", first.UUID); k != 1 {
		t.Errorf("the first message's row (%s), acked while its batch was held, was not settled by the held claim (%d rows delivered without a claim key, want 1)", first.UUID, k)
	}
}

// testHeldSubLeasesFirst: a subscription claims under leases until
// HoldClaimsAfter has passed since it started (then a restarted process
// counts an attempt for an event that crashed it: see
// TestHeldSubscriberCrashLoop in tests/fault), then holds its claims.
func testHeldSubLeasesFirst(t *testing.T, e *env) {
	const after = 1500 * time.Millisecond
	e.enqueueAll(event("held", "early"))
	start := time.Now()
	_, msgs := heldSubscribe(t, e, "held", outbox.SubscriberConfig{HoldClaimsAfter: after})
	subscribed := time.Now() // the window started between start and now
	m := receive(t, msgs, 10*time.Second)
	if time.Since(start) >= after {
		t.Skipf("the first message took %s, longer than HoldClaimsAfter (%s): the machine is too slow for this check", time.Since(start), after)
	}
	if w := e.count("SELECT COUNT(*) FROM millpond_deliveries WHERE stream = 'held' AND status = 'processing' AND attempts = 1 AND claim_key <> ''"); w != 1 {
		t.Errorf("the first event was not leased: %d rows processing under a claim key, want 1", w)
	}
	m.Ack()
	waitFor(t, "the leased event delivered", func() bool {
		return e.count("SELECT COUNT(*) FROM millpond_deliveries WHERE stream = 'held' AND status = 'delivered'") == 1
	})
	time.Sleep(time.Until(subscribed.Add(after + 100*time.Millisecond)))
	e.enqueueAll(event("held", "late"))
	m = receive(t, msgs, 10*time.Second)
	if m.UUID != "late" {
		t.Fatalf("got %s, want late", m.UUID)
	}
	if w := e.count("SELECT COUNT(*) FROM millpond_deliveries WHERE stream = 'held' AND status = 'pending' AND attempts = 0"); w != 1 {
		t.Errorf("the event claimed after HoldClaimsAfter was written to: %d rows pending at attempt 0, want 1", w)
	}
	if l := e.lockedRows("held"); l != 1 {
		t.Errorf("%d rows locked while the event claimed after HoldClaimsAfter is handled, want 1 (held)", l)
	}
	m.Ack()
	waitFor(t, "both events delivered", func() bool {
		return e.count("SELECT COUNT(*) FROM millpond_deliveries WHERE stream = 'held' AND status = 'delivered'") == 2
	})
}

func testHeldSubNack(t *testing.T, e *env) {
	ids := e.enqueueAll(event("held", "ok-0"), event("held", "bad"), event("held", "ok-1"))
	_, msgs := heldSubscribe(t, e, "held", outbox.SubscriberConfig{
		MaxInFlight: 3, MaxAttempts: 2, Backoff: func(int) time.Duration { return 10 * time.Millisecond },
	})
	var badAttempts []string
	for acked := 0; acked < 2 || len(badAttempts) < 2; {
		m := receive(t, msgs, 10*time.Second)
		if m.UUID == "bad" {
			badAttempts = append(badAttempts, m.Metadata.Get(outbox.MetadataAttempt))
			m.Metadata.Set(outbox.MetadataHandlerError, "boom")
			m.Nack()
			continue
		}
		acked++
		m.Ack()
	}
	if fmt.Sprint(badAttempts) != "[1 2]" {
		t.Fatalf("the nacked event came with attempts %v, want [1 2]", badAttempts)
	}
	expectNothing(t, msgs, 300*time.Millisecond)
	waitFor(t, "the nacked event dead-lettered", func() bool {
		return e.count("SELECT COUNT(*) FROM millpond_outbox WHERE id = ? AND status = 'dead_letter' AND attempts = 2 AND last_error = 'boom'", ids[1]) == 1
	})
	e.expectRow(ids[0], outbox.StatusDelivered, 1)
	e.expectRow(ids[2], outbox.StatusDelivered, 1)
}

func testHeldSubClose(t *testing.T, e *env) {
	ids := e.enqueueAll(event("held", "a"), event("held", "b"), event("held", "c"), event("held", "d"))
	sub, msgs := heldSubscribe(t, e, "held", outbox.SubscriberConfig{MaxInFlight: 2, Lease: time.Minute, CloseTimeout: 100 * time.Millisecond})
	acked := receive(t, msgs, 10*time.Second)
	unsettled := receive(t, msgs, 10*time.Second)
	acked.Ack()
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	_ = unsettled // never acked: the close timeout passes
	// The acked event was settled at the close; the others are due at
	// once, unchanged, though the lease is a minute.
	delivered := map[string]bool{acked.UUID: true}
	for i, key := range []string{"a", "b", "c", "d"} {
		want, attempts := outbox.StatusPending, 0
		if delivered[key] {
			want, attempts = outbox.StatusDelivered, 1
		}
		e.expectRow(ids[i], want, attempts)
	}
	if l := e.lockedRows("held"); l != 0 {
		t.Fatalf("%d rows still locked after Close", l)
	}
	got := e.claim(claimReq("held", 10, time.Minute, 5))
	if len(got) != 3 {
		t.Fatalf("a claim after Close took %d events, want the 3 not acked", len(got))
	}
}

func testHeldSubSlowHandler(t *testing.T, e *env) {
	fast := e.enqueue(event("held", "fast")).ID
	slow := e.enqueue(event("held", "slow")).ID
	// With a Lease of 1 s a batch still open after 333 ms is settled
	// early: the acked event is delivered and the slow one leased, and
	// its lease extended, while its handler runs for 2.5 s.
	_, msgs := heldSubscribe(t, e, "held", outbox.SubscriberConfig{Lease: time.Second, MaxInFlight: 2})
	var slowMsg *message.Message
	for range 2 {
		m := receive(t, msgs, 10*time.Second)
		if m.UUID == "fast" {
			m.Ack()
		} else {
			slowMsg = m
		}
	}
	time.Sleep(time.Second)
	e.expectRow(fast, outbox.StatusDelivered, 1)
	e.expectRow(slow, outbox.StatusProcessing, 1)
	time.Sleep(1500 * time.Millisecond)
	slowMsg.Ack()
	waitFor(t, "the slow event delivered", func() bool {
		return e.count("SELECT COUNT(*) FROM millpond_outbox WHERE id = ? AND status = 'delivered' AND attempts = 1", slow) == 1
	})
	expectNothing(t, msgs, 500*time.Millisecond)
}

// testHeldSubLostBatch: a batch whose transaction dies (its backend is
// terminated) cannot settle; its events are due again and claimed anew,
// and the copies it still has queued are not handed out, so no event but
// the one whose ack was lost is handled twice.
func testHeldSubLostBatch(t *testing.T, e *env) {
	e.enqueueAll(event("held", "a"), event("held", "b"), event("held", "c"), event("held", "d"), event("held", "e"))
	_, msgs := heldSubscribe(t, e, "held", outbox.SubscriberConfig{Lease: 3 * time.Second})
	first := receive(t, msgs, 10*time.Second)
	e.killHolder()
	time.Sleep(1500 * time.Millisecond) // the early settle (after 1 s) fails
	seen := map[string]int{first.UUID: 1}
	first.Ack()
	deadline := time.After(3 * time.Second)
collect:
	for {
		select {
		case m := <-msgs:
			seen[m.UUID]++
			m.Ack()
		case <-deadline:
			break collect
		}
	}
	for _, key := range []string{"a", "b", "c", "d", "e"} {
		want := 1
		if key == first.UUID {
			want = 2 // its ack was lost with the batch
		}
		if seen[key] != want {
			t.Errorf("%s handled %d times, want %d (all: %v)", key, seen[key], want, seen)
		}
	}
}

func testHeldSubOrdered(t *testing.T, e *env) {
	const keys, perKey = 10, 10
	var evs []outbox.Event
	for i := range perKey {
		for k := range keys {
			ev := event("held", fmt.Sprintf("o%d-%d", k, i))
			ev.OrderingKey = fmt.Sprint("order-", k)
			evs = append(evs, ev)
		}
	}
	e.enqueueAll(evs...)
	_, msgs := heldSubscribe(t, e, "held", outbox.SubscriberConfig{BatchSize: 50, MaxInFlight: 4})
	next := map[string]int64{}
	for range keys * perKey {
		m := receive(t, msgs, 10*time.Second)
		okey := m.Metadata.Get(outbox.MetadataOrderingKey)
		seq, err := strconv.ParseInt(m.Metadata.Get(outbox.MetadataOrderingSeq), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if want := next[okey] + 1; seq != want {
			t.Fatalf("key %s: got sequence %d, want %d", okey, seq, want)
		}
		next[okey] = seq
		m.Ack()
	}
	expectNothing(t, msgs, 300*time.Millisecond)
	waitFor(t, "every ordered event delivered", func() bool {
		return e.count("SELECT COUNT(*) FROM millpond_deliveries WHERE stream = 'held' AND status = 'delivered' AND attempts = 1") == keys*perKey
	})
}

func testHeldSubNoReceipt(t *testing.T, e *env) {
	id := e.enqueue(event("held", "a")).ID
	_, msgs := heldSubscribe(t, e, "held", outbox.SubscriberConfig{})
	m := receive(t, msgs, 10*time.Second)
	if _, ok := outbox.ReceiptFromContext(m.Context()); ok {
		t.Error("a held message carries a receipt")
	}
	tx, _, rollback := e.db.Begin(t)
	err := outbox.AcknowledgeMessageInTx(e.ctx, tx, m)
	rollback()
	if !errors.Is(err, outbox.ErrNoReceipt) {
		t.Fatalf("AcknowledgeMessageInTx of a held message: want ErrNoReceipt, got %v", err)
	}
	m.Ack()
	waitFor(t, "the event delivered", func() bool {
		return e.count("SELECT COUNT(*) FROM millpond_outbox WHERE id = ? AND status = 'delivered'", id) == 1
	})
}

// testHeldSubBudget: with the store's one held claim open, the
// subscription claims its next batches under leases (rows processing,
// receipts on the messages); every event is still delivered once.
func testHeldSubBudget(t *testing.T, e *env) {
	const n = 300
	evs := keyedEvents("held", n)
	e.enqueueAll(evs...)
	_, msgs := heldSubscribe(t, e, "held", outbox.SubscriberConfig{BatchSize: 100})
	first := receive(t, msgs, 10*time.Second)
	if _, ok := outbox.ReceiptFromContext(first.Context()); ok {
		t.Fatal("the first batch was not held")
	}
	// The first batch is held (unacked); the next ones are leased.
	waitFor(t, "a leased batch beside the held one", func() bool {
		return e.count("SELECT COUNT(*) FROM millpond_deliveries WHERE stream = 'held' AND status = 'processing'") > 0
	})
	seen := map[string]int{first.UUID: 1}
	first.Ack()
	leased := 0
	for len(seen) < n {
		m := receive(t, msgs, 10*time.Second)
		seen[m.UUID]++
		if _, ok := outbox.ReceiptFromContext(m.Context()); ok {
			leased++
		}
		m.Ack()
	}
	expectNothing(t, msgs, 300*time.Millisecond)
	for key, k := range seen {
		if k != 1 {
			t.Errorf("%s delivered %d times", key, k)
		}
	}
	if leased == 0 {
		t.Error("no message came from a leased claim")
	}
	waitFor(t, "every row delivered at attempt 1", func() bool {
		return e.count("SELECT COUNT(*) FROM millpond_deliveries WHERE stream = 'held' AND status = 'delivered' AND attempts = 1") == n
	})
}

// testHeldSubSlotsFull: with its three held batches open behind unsettled
// messages, the subscription claims its next batches under leases instead
// of waiting for one to settle (which would take Lease/3, here 10 s).
func testHeldSubSlotsFull(t *testing.T, e *env) {
	evs := keyedEvents("held", 8)
	e.enqueueAll(evs...)
	_, msgs := heldSubscribe(t, e, "held", outbox.SubscriberConfig{BatchSize: 1, MaxInFlight: 4})
	var waiting []*message.Message
	for range 3 { // one per batch: every slot taken
		m := receive(t, msgs, 10*time.Second)
		if _, ok := outbox.ReceiptFromContext(m.Context()); ok {
			t.Fatalf("message %s of the first three batches was leased", m.UUID)
		}
		waiting = append(waiting, m)
	}
	leased := 0
	for range len(evs) - 3 {
		m := receive(t, msgs, 2*time.Second)
		if _, ok := outbox.ReceiptFromContext(m.Context()); ok {
			leased++
		}
		m.Ack()
	}
	if leased == 0 {
		t.Error("no batch was claimed under a lease while the held ones were open")
	}
	for _, m := range waiting {
		m.Ack()
	}
	waitFor(t, "every event delivered", func() bool {
		return e.count("SELECT COUNT(*) FROM millpond_deliveries WHERE stream = 'held' AND status = 'delivered' AND attempts = 1") == int64(len(evs))
	})
}

// testHeldSubMetrics: millpond.held_batches counts a batch settled early
// (a message still open after Lease/3) and one settled whole.
func testHeldSubMetrics(t *testing.T, e *env, rig *telemetryRig) {
	e.enqueueAll(event("held", "fast"), event("held", "slow"))
	_, msgs := heldSubscribe(t, e, "held", outbox.SubscriberConfig{Lease: time.Second, MaxInFlight: 2})
	var slow *message.Message
	for range 2 {
		m := receive(t, msgs, 10*time.Second)
		if m.UUID == "slow" {
			slow = m
			continue
		}
		m.Ack()
	}
	time.Sleep(600 * time.Millisecond) // past Lease/3
	slow.Ack()
	e.enqueueAll(event("held", "a"), event("held", "b"))
	for range 2 {
		receive(t, msgs, 10*time.Second).Ack()
	}
	waitFor(t, "every event delivered", func() bool {
		return e.count("SELECT COUNT(*) FROM millpond_deliveries WHERE stream = 'held' AND status = 'delivered'") == 4
	})
	rm := rig.collect(t)
	if n, _ := metricValue(rm, "millpond.held_batches", outbox.AttrOutcome.String("settled_early")); n != 1 {
		t.Errorf("held_batches{settled_early} = %v, want 1", n)
	}
	if n, _ := metricValue(rm, "millpond.held_batches", outbox.AttrOutcome.String("settled")); n < 1 {
		t.Errorf("held_batches{settled} = %v, want at least 1", n)
	}
	if n, _ := metricValue(rm, "millpond.held_batches", outbox.AttrOutcome.String("lost")); n != 0 {
		t.Errorf("held_batches{lost} = %v, want 0", n)
	}
}

// keyedEvents are n events of stream with the keys k0000, k0001, ...
func keyedEvents(stream string, n int) []outbox.Event {
	evs := make([]outbox.Event, n)
	for i := range evs {
		evs[i] = event(stream, fmt.Sprintf("k%04d", i))
	}
	return evs
}

// testHeldSubRetryDuringBacklog: over a backlog a holding subscription's
// claims start after its last full claim (ClaimRequest.After), skipping
// its own held rows; an event nacked early, whose retry is due below that
// bound, is still delivered again while the backlog is being worked
// through, not after it.
func testHeldSubRetryDuringBacklog(t *testing.T, e *env) {
	testRetryDuringBacklog(t, e, func(cfg outbox.SubscriberConfig) <-chan *message.Message {
		_, msgs := heldSubscribe(t, e, "held", cfg)
		return msgs
	})
}

// testRetryDuringBacklog: an event nacked early, whose retry is due below
// the claim bound of the Subscriber that subscribe returns (stream
// "held"), is delivered again while the backlog is being worked through,
// not after it.
func testRetryDuringBacklog(t *testing.T, e *env, subscribe func(outbox.SubscriberConfig) <-chan *message.Message) {
	const n = 1500
	e.enqueueAll(keyedEvents("held", n)...)
	msgs := subscribe(outbox.SubscriberConfig{
		BatchSize: 100, MaxInFlight: 4, Backoff: func(int) time.Duration { return 10 * time.Millisecond },
	})
	seen := map[string]bool{}
	retriedAfter := -1
	for len(seen) < n || retriedAfter < 0 {
		m := receive(t, msgs, 10*time.Second)
		if m.UUID == "k0000" && !seen[m.UUID] {
			seen[m.UUID] = true
			m.Nack()
			continue
		}
		if m.UUID == "k0000" {
			retriedAfter = len(seen)
		}
		seen[m.UUID] = true
		time.Sleep(time.Millisecond) // about 2 s of backlog
		m.Ack()
	}
	if retriedAfter > n*7/10 {
		t.Fatalf("the nacked first event came again after %d of %d events were handled, want it during the backlog", retriedAfter, n)
	}
	t.Logf("the nacked first event came again after %d of %d events", retriedAfter, n)
}
