package tests

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// TestDeleteOnAck checks outbox.WithDeleteOnAck on every dialect: an
// acknowledgement deletes the delivery rows of live receipts, events stay
// (the idempotency keys) until Purge.
func TestDeleteOnAck(t *testing.T) {
	cases := []conformanceCase{
		{name: "AckDeletesLiveReceiptsRowsAndReportsStaleOnes", run: testDeleteOnAckReceipts},
		{name: "OrderedEventsKeepTheirSequence", run: testDeleteOnAckOrdered},
		{name: "IdempotentReEnqueueAfterAck", run: testDeleteOnAckIdempotent},
		{name: "PurgeDeletesOldEventsWithoutRows", run: testDeleteOnAckPurge},
		{name: "CountPurgeableCountsEventsOfRowsDeliveredBefore", run: testDeleteOnAckCountDeliveredBefore},
		{name: "DiscardingTheLastRowKeepsTheEventUntilPurge", run: testDeleteOnAckDiscard},
	}
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					e := newEnv(t, dialect, !c.dbClock, outbox.WithDeleteOnAck())
					e.deleteOnAck = true
					c.run(t, e)
				})
			}
		})
	}
}

func (e *env) deliveryRows() int64 {
	e.t.Helper()
	return e.count("SELECT COUNT(*) FROM millpond_deliveries")
}

func (e *env) eventRows() int64 {
	e.t.Helper()
	return e.count("SELECT COUNT(*) FROM millpond_events")
}

func (e *env) hasRow(id int64) bool {
	e.t.Helper()
	return e.count("SELECT COUNT(*) FROM millpond_deliveries WHERE id = ?", id) == 1
}

func testDeleteOnAckReceipts(t *testing.T, e *env) {
	for i := range 7 {
		e.enqueue(event("s", "k"+strconv.Itoa(i)))
	}
	req := claimReq("s", 10, time.Minute, 5)
	cs := e.claim(req)
	if len(cs) != 7 {
		t.Fatalf("claimed %d, want 7", len(cs))
	}
	wrong := outbox.Receipt{ID: cs[1].ID, ClaimKey: wrongClaimKey}
	stale, err := e.s.AcknowledgeBatch(e.ctx, []outbox.Receipt{cs[2].Receipt(), wrong, cs[0].Receipt()})
	if err != nil {
		t.Fatal(err)
	}
	if len(stale) != 1 || stale[0] != wrong {
		t.Fatalf("stale receipts %v, want only the wrong key's", stale)
	}
	if e.hasRow(cs[0].ID) || e.hasRow(cs[2].ID) || !e.hasRow(cs[1].ID) {
		t.Fatalf("want rows %d and %d deleted, %d kept", cs[0].ID, cs[2].ID, cs[1].ID)
	}
	e.expectRow(cs[1].ID, "processing", 1)
	// A receipt acknowledged before is stale now.
	if stale, err := e.s.AcknowledgeBatch(e.ctx, []outbox.Receipt{cs[0].Receipt()}); err != nil || len(stale) != 1 {
		t.Fatalf("second ack of one receipt: stale %v, err %v", stale, err)
	}
	if err := e.s.Acknowledge(e.ctx, cs[0].Receipt()); !errors.Is(err, outbox.ErrStaleClaim) {
		t.Fatalf("Acknowledge of a deleted row: %v, want ErrStaleClaim", err)
	}
	// In the caller's transaction: rolled back, the row stays; committed, gone.
	tx, _, rollback := e.db.Begin(t)
	if err := e.s.AcknowledgeInTx(e.ctx, tx, cs[3].Receipt()); err != nil {
		t.Fatal(err)
	}
	rollback()
	e.expectRow(cs[3].ID, "processing", 1)
	tx, commit, _ := e.db.Begin(t)
	if err := e.s.AcknowledgeInTx(e.ctx, tx, cs[3].Receipt()); err != nil {
		t.Fatal(err)
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}
	if e.hasRow(cs[3].ID) {
		t.Fatal("AcknowledgeInTx kept the row")
	}
	// Acknowledging while claiming the next events.
	next, stale, err := e.s.AcknowledgeAndClaimNext(e.ctx, []outbox.Receipt{cs[4].Receipt(), wrong}, req)
	if err != nil || len(next) != 0 || len(stale) != 1 {
		t.Fatalf("AcknowledgeAndClaimNext: next %d, stale %v, err %v", len(next), stale, err)
	}
	if e.hasRow(cs[4].ID) {
		t.Fatal("AcknowledgeAndClaimNext kept the row")
	}
	// Expired leases: the receipts are stale and their rows stay.
	e.clock.Advance(2 * time.Minute)
	stale, err = e.s.AcknowledgeBatch(e.ctx, []outbox.Receipt{cs[5].Receipt(), cs[6].Receipt()})
	if err != nil || len(stale) != 2 {
		t.Fatalf("ack after the leases expired: stale %v, err %v", stale, err)
	}
	e.expectRow(cs[5].ID, "processing", 1)
	e.expectRow(cs[6].ID, "processing", 1)
	if n := e.deliveryRows(); n != 3 {
		t.Fatalf("%d delivery rows, want 3 (the wrong key's and the expired ones)", n)
	}
	if n := e.eventRows(); n != 7 {
		t.Fatalf("%d events, want all 7 kept until Purge", n)
	}
	// Reads see no acknowledged row, and nothing errors.
	found, err := e.s.FindEvents(e.ctx, outbox.EventQuery{Stream: "s", Key: "k0"})
	if err != nil || len(found) != 0 {
		t.Fatalf("FindEvents of an acknowledged event: %d rows, err %v", len(found), err)
	}
	if found, err := e.s.FindEvents(e.ctx, outbox.EventQuery{ID: cs[0].ID}); err != nil || len(found) != 0 {
		t.Fatalf("FindEvents of an acknowledged row: %d rows, err %v", len(found), err)
	}
	groups, err := e.s.ListGroups(e.ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range groups {
		if g.Delivered != 0 {
			t.Fatalf("ListGroups reports %d delivered rows", g.Delivered)
		}
	}
	if st := e.stats("s", ""); st.Processing != 3 || st.Pending != 0 {
		t.Fatalf("stats %+v, want 3 processing", st)
	}
}

func testDeleteOnAckOrdered(t *testing.T, e *env) {
	for _, k := range []string{"a1", "b1", "a2", "a3", "b2", "b3"} {
		e.enqueue(ordered("s", k, k[:1]))
	}
	req := claimReq("s", 10, time.Minute, 1)
	heads := e.expectClaimed(req, "a1", "b1")
	// a1 hands a2 over; b1 promotes b2.
	next, stale, err := e.s.AcknowledgeAndClaimNext(e.ctx, []outbox.Receipt{heads["a1"].Receipt()}, req)
	if err != nil || len(stale) != 0 || len(next) != 1 || next[0].Key != "a2" {
		t.Fatalf("ack of a1: next %v, stale %v, err %v", keysOfList(next), stale, err)
	}
	e.ack(heads["b1"])
	b2 := e.expectClaimed(req, "b2")["b2"]
	// a2 fails its only attempt: held, a3 waits.
	out, err := e.s.Fail(e.ctx, next[0].Receipt(), outbox.Failure{Reason: "boom", MaxAttempts: 1})
	if err != nil || !out.DeadLettered {
		t.Fatalf("fail a2: %+v, %v", out, err)
	}
	e.ack(b2)
	e.expectClaimed(req, "b3")
	// b3's lease is not acknowledged yet; discarding the held a2 frees a3.
	if n, err := e.s.DiscardDead(e.ctx, outbox.DeadSelector{Stream: "s", IDs: []int64{next[0].ID}}); err != nil || n != 1 {
		t.Fatalf("discard a2: %d, %v", n, err)
	}
	a3 := e.expectClaimed(req, "a3")["a3"]
	e.ack(a3)
	e.clock.Advance(2 * time.Minute) // b3's lease expires: it is delivered again
	again := e.expectClaimed(claimReq("s", 10, time.Minute, 5), "b3")
	e.ack(again["b3"])
	if n := e.deliveryRows(); n != 0 {
		t.Fatalf("%d delivery rows left, want 0", n)
	}
	if n := e.count("SELECT COUNT(*) FROM millpond_ordering WHERE unsettled <> 0"); n != 0 {
		t.Fatalf("%d keys still count unsettled events", n)
	}
	if n := e.eventRows(); n != 6 {
		t.Fatalf("%d events, want 6", n)
	}
}

func keysOfList(cs []outbox.Claimed) []string {
	return project(cs, func(c outbox.Claimed) string { return c.Key })
}

func testDeleteOnAckIdempotent(t *testing.T, e *env) {
	first := e.enqueue(event("s", "k"))
	firstOrdered := e.enqueue(ordered("s", "o", "key"))
	req := claimReq("s", 10, time.Minute, 5)
	for _, c := range e.claim(req) {
		e.ack(c)
	}
	if n := e.deliveryRows(); n != 0 {
		t.Fatalf("%d delivery rows after the acks, want 0", n)
	}
	for _, ev := range []outbox.Event{event("s", "k"), ordered("s", "o", "key")} {
		res := e.enqueue(ev)
		if res != (outbox.Enqueued{ID: 0, Inserted: false}) {
			t.Fatalf("re-enqueue of acknowledged %s (first %+v / %+v): %+v, want the known event with no row", ev.Key, first, firstOrdered, res)
		}
		changed := ev
		changed.Payload = []byte(`{"other":true}`)
		tx, _, rollback := e.db.Begin(t)
		err := e.enqueueErr(tx, changed)
		rollback()
		if !errors.Is(err, outbox.ErrIdempotencyConflict) {
			t.Fatalf("re-enqueue of %s with other content: %v, want ErrIdempotencyConflict", ev.Key, err)
		}
	}
	e.expectNothingDue(req)
	if n := e.eventRows(); n != 2 {
		t.Fatalf("%d events, want 2", n)
	}
	if last, unsettled := e.keyState("s", "", "key"); last != 1 || unsettled != 0 {
		t.Fatalf("key state last_seq %d unsettled %d, want 1 and 0", last, unsettled)
	}
}

func testDeleteOnAckPurge(t *testing.T, e *env) {
	req := claimReq("s", 1, time.Minute, 1)
	ackNext := func(key string) {
		t.Helper()
		c := e.claimOne(req)
		if c.Key != key {
			t.Fatalf("claimed %s, want %s", c.Key, key)
		}
		e.ack(c)
	}
	for _, k := range []string{"old1", "old2", "old3"} {
		e.enqueue(event("s", k))
		ackNext(k)
	}
	e.enqueue(event("s", "old-dead"))
	dead := e.claimOne(req)
	if out, err := e.s.Fail(e.ctx, dead.Receipt(), outbox.Failure{Reason: "boom", MaxAttempts: 1}); err != nil || !out.DeadLettered {
		t.Fatalf("fail: %+v, %v", out, err)
	}
	e.enqueue(event("s", "old-pending"))
	e.enqueue(event("t", "old-other-stream"))
	ackNextT := e.claimOne(claimReq("t", 1, time.Minute, 1))
	e.ack(ackNextT)
	e.clock.Advance(2 * time.Hour)
	e.enqueue(event("s", "young"))
	young := e.claim(claimReq("s", 10, time.Minute, 5))
	for _, c := range young {
		e.ack(c) // old-pending and young
	}
	e.enqueue(event("s", "young-pending"))
	// old1-3, old-other-stream and old-pending are old and have no row left;
	// young has none but is younger; old-dead and young-pending keep rows.
	if n, err := e.s.CountPurgeable(e.ctx, time.Hour); err != nil || n != 5 {
		t.Fatalf("CountPurgeable: %d, %v; want the 5 old events without rows", n, err)
	}
	var total int64
	for _, want := range []int64{2, 2, 1, 0} {
		n, err := e.s.Purge(e.ctx, time.Hour, 2)
		if err != nil {
			t.Fatal(err)
		}
		if n != want {
			t.Fatalf("purge: %d, want %d (after %d)", n, want, total)
		}
		total += n
	}
	if n := e.eventRows(); n != 3 {
		t.Fatalf("%d events left, want 3 (old-dead, young, young-pending)", n)
	}
	for _, k := range []string{"old-dead", "young", "young-pending"} {
		if n := e.count("SELECT COUNT(*) FROM millpond_events WHERE event_key = ?", k); n != 1 {
			t.Fatalf("event %s was purged", k)
		}
	}
	if n := e.deliveryRows(); n != 2 {
		t.Fatalf("%d delivery rows, want 2", n)
	}
	// A purged key is new again.
	if res := e.enqueue(event("s", "old1")); !res.Inserted {
		t.Fatalf("re-enqueue of a purged key: %+v, want inserted", res)
	}
}

// testDeleteOnAckCountDeliveredBefore: rows delivered before the option
// was set stay until Purge, which deletes them and then their events (no
// row points at them any more). CountPurgeable, which the CLI's purge
// shows and caps its deletion at, counts both, as Purge does.
func testDeleteOnAckCountDeliveredBefore(t *testing.T, e *env) {
	req := claimReq("s", 1, time.Minute, 1)
	withOption := e.s
	e.s = e.db.Store(t, outbox.WithoutListen(), outbox.WithClock(e.clock.Now)) // before the option
	for _, k := range []string{"before1", "before2"} {
		e.enqueue(event("s", k))
		e.ack(e.claimOne(req))
	}
	e.s = withOption
	e.enqueue(event("s", "after"))
	e.ack(e.claimOne(req))
	e.clock.Advance(2 * time.Hour)
	if rows, events := e.deliveryRows(), e.eventRows(); rows != 2 || events != 3 {
		t.Fatalf("%d rows and %d events, want the 2 delivered before the option and 3", rows, events)
	}
	n, err := e.s.CountPurgeable(e.ctx, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	purged, err := e.s.Purge(e.ctx, time.Hour, 100)
	if err != nil {
		t.Fatal(err)
	}
	if purged != 5 || n != purged {
		t.Fatalf("CountPurgeable %d, Purge %d; want 5 (2 rows, their 2 events, and the event acknowledged with the option)", n, purged)
	}
	if rows, events := e.deliveryRows(), e.eventRows(); rows != 0 || events != 0 {
		t.Fatalf("after the purge: %d rows and %d events", rows, events)
	}
}

func testDeleteOnAckDiscard(t *testing.T, e *env) {
	e.enqueue(event("s", "d"))
	c := e.claimOne(claimReq("s", 1, time.Minute, 1))
	if out, err := e.s.Fail(e.ctx, c.Receipt(), outbox.Failure{Reason: "boom", MaxAttempts: 1}); err != nil || !out.DeadLettered {
		t.Fatalf("fail: %+v, %v", out, err)
	}
	if n, err := e.s.DiscardDead(e.ctx, outbox.DeadSelector{Stream: "s", IDs: []int64{c.ID}}); err != nil || n != 1 {
		t.Fatalf("discard: %d, %v", n, err)
	}
	if rows, events := e.deliveryRows(), e.eventRows(); rows != 0 || events != 1 {
		t.Fatalf("after the discard: %d rows and %d events, want 0 and 1", rows, events)
	}
	if res := e.enqueue(event("s", "d")); res != (outbox.Enqueued{}) {
		t.Fatalf("re-enqueue of a discarded event before Purge: %+v, want the known event with no row", res)
	}
	if n, err := e.s.Purge(e.ctx, time.Hour, 10); err != nil || n != 0 {
		t.Fatalf("purge before the horizon: %d, %v", n, err)
	}
	e.clock.Advance(2 * time.Hour)
	if n, err := e.s.Purge(e.ctx, time.Hour, 10); err != nil || n != 1 {
		t.Fatalf("purge after the horizon: %d, %v", n, err)
	}
	if n := e.eventRows(); n != 0 {
		t.Fatalf("%d events after Purge, want 0", n)
	}
}

// TestDeleteOnAckSubscriberExactlyOnce: a Subscriber delivering n events,
// acknowledged by concurrent handlers slow enough that leases are
// extended, leaves no delivery row and every event, each delivered once.
func TestDeleteOnAckSubscriberExactlyOnce(t *testing.T) {
	t.Parallel()
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			const n = 1000
			const stream = "delack"
			db := testdb.New(t, dialect)
			store := db.Store(t, outbox.WithDeleteOnAck())
			enqueueMany(t, db, store, stream, "ev", n)
			sub, err := outbox.NewSubscriber(store, outbox.SubscriberConfig{
				Lease: 3 * time.Second, BatchSize: 1000, MaxInFlight: 8, PollInterval: 20 * time.Millisecond,
			})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			msgs, err := sub.Subscribe(ctx, stream)
			if err != nil {
				t.Fatal(err)
			}
			// 1,000 events (one batch) at 50 ms over 8 handlers take over
			// 6 s: the batch's leases (3 s, extended every second) are
			// extended while the handlers ack.
			got := countDeliveries(msgs, 8, n, 50*time.Millisecond)
			select {
			case <-got.all:
			case <-time.After(90 * time.Second):
				t.Errorf("not every event was delivered within 90 s")
			}
			deadline := time.Now().Add(30 * time.Second)
			for db.Count(t, "SELECT COUNT(*) FROM millpond_deliveries") > 0 && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			time.Sleep(3500 * time.Millisecond) // longer than a lease: a lost ack would deliver again
			if err := sub.Close(); err != nil {
				t.Fatal(err)
			}
			got.readers.Wait()
			deliveries, duplicates := got.result()
			rows := db.Count(t, "SELECT COUNT(*) FROM millpond_deliveries")
			events := db.Count(t, "SELECT COUNT(*) FROM millpond_events")
			if duplicates > 0 || len(deliveries) != n || rows != 0 || events != n {
				t.Errorf("%d distinct events delivered, %d duplicates, %d delivery rows and %d events left; want %d, 0, 0, %d",
					len(deliveries), duplicates, rows, events, n, n)
			}
		})
	}
}
