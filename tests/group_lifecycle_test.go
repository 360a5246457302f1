package tests

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// TestGroupLifecycleConformance runs the group lifecycle cases (listing,
// retiring and rerouting groups, discarding dead letters, schema reporting)
// against every dialect, each case on its own isolated database, like
// TestStoreConformance.
func TestGroupLifecycleConformance(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			for _, c := range lifecycleCases {
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					c.run(t, newEnv(t, dialect, !c.dbClock))
				})
			}
		})
	}
}

var lifecycleCases = []conformanceCase{
	{name: "ListGroups", run: testListGroups},
	{name: "GroupOfEveryKindAndOneGetsOneRow", run: testGroupEveryKindAndOne},
	{name: "RetireGroupRefusesUntilDrained", run: testRetireGroup},
	{name: "RetireGroupDiscards", run: testRetireGroupDiscard},
	{name: "DiscardDead", run: testDiscardDead},
	{name: "DiscardDeadInChunks", run: testDiscardDeadChunks},
	{name: "ReroutePending", run: testReroutePending},
	{name: "ReroutePendingInChunks", run: testReroutePendingChunks},
	{name: "ConcurrentDiscardsDeleteEachRowOnce", dbClock: true, run: testConcurrentDiscards},
	{name: "SchemaVersionAndMigrateReport", run: testSchemaVersion},
}

// enqueueAll enqueues the events in one transaction and returns their ids.
func (e *env) enqueueAll(evs ...outbox.Event) []int64 {
	e.t.Helper()
	tx, commit, rollback := e.db.Begin(e.t)
	ids := make([]int64, len(evs))
	for i, ev := range evs {
		res, err := e.s.Enqueue(e.ctx, tx, ev)
		if err != nil {
			rollback()
			e.t.Fatalf("enqueue %d: %v", i, err)
		}
		ids[i] = res.ID
	}
	if err := commit(); err != nil {
		e.t.Fatal(err)
	}
	return ids
}

func kindEvent(stream, key, kind string) outbox.Event {
	return outbox.Event{Stream: stream, Key: key, Kind: kind, Payload: []byte(`{"key":"` + key + `"}`), Metadata: map[string]string{"trace": key}}
}

// deadLetterAll claims every due event of the group with one attempt and
// fails it, and returns the ids it dead-lettered.
func (e *env) deadLetterAll(stream, group string) []int64 {
	e.t.Helper()
	var ids []int64
	for {
		cs := e.claim(outbox.ClaimRequest{Stream: stream, Group: group, Worker: "w", Limit: 100, Lease: time.Minute, MaxAttempts: 1})
		if len(cs) == 0 {
			return ids
		}
		for _, c := range cs {
			if out, err := e.s.Fail(e.ctx, c.Receipt(), outbox.Failure{Reason: "no", MaxAttempts: 1}); err != nil || !out.DeadLettered {
				e.t.Fatalf("fail %d: %+v, %v", c.ID, out, err)
			}
			ids = append(ids, c.ID)
		}
	}
}

// groupRows counts the rows of a group in a state ("" any state).
func (e *env) groupRows(stream, group, status string) int64 {
	e.t.Helper()
	if status == "" {
		return e.count("SELECT COUNT(*) FROM millpond_outbox WHERE stream = ? AND consumer_group = ?", stream, group)
	}
	return e.count("SELECT COUNT(*) FROM millpond_outbox WHERE stream = ? AND consumer_group = ? AND status = ?", stream, group, status)
}

func (e *env) registered(stream string) []string {
	e.t.Helper()
	regs, err := e.s.RegisteredGroups(e.ctx, stream)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, r := range regs {
		out = append(out, r.Group)
	}
	return out
}

// testGroupEveryKindAndOne: a group registered for every kind and for one
// kind as well matches an event of that kind twice; it still gets one
// delivery row, and the event's id is that row's.
func testGroupEveryKindAndOne(t *testing.T, e *env) {
	if err := e.s.RegisterGroup(e.ctx, "orders", "audit"); err != nil {
		t.Fatal(err)
	}
	if err := e.s.RegisterGroup(e.ctx, "orders", "audit", "Order.Placed"); err != nil {
		t.Fatal(err)
	}
	if err := e.s.RegisterGroup(e.ctx, "orders", "billing", "Order.Placed"); err != nil {
		t.Fatal(err)
	}
	ids := e.enqueueAll(kindEvent("orders", "o1", "Order.Placed"), kindEvent("orders", "o2", "Order.Shipped"))
	for _, c := range []struct {
		group, kind string
		want        int64
	}{{"audit", "Order.Placed", 1}, {"billing", "Order.Placed", 1}, {"audit", "Order.Shipped", 1}, {"billing", "Order.Shipped", 0}, {"", "", 0}} {
		n := e.count("SELECT COUNT(*) FROM millpond_outbox WHERE consumer_group = ? AND event_kind = ?", c.group, c.kind)
		if c.kind == "" {
			n = e.count("SELECT COUNT(*) FROM millpond_outbox WHERE consumer_group = ?", c.group)
		}
		if n != c.want {
			t.Errorf("group %q, kind %q: %d rows, want %d", c.group, c.kind, n, c.want)
		}
	}
	if first := e.count("SELECT MIN(id) FROM millpond_outbox WHERE event_key = 'o1'"); first != ids[0] {
		t.Errorf("enqueue returned id %d, the event's first row is %d", ids[0], first)
	}
	got := e.claim(outbox.ClaimRequest{Stream: "orders", Group: "audit", Worker: "w", Limit: 10, Lease: time.Minute, MaxAttempts: 3})
	if len(got) != 2 {
		t.Fatalf("audit claimed %d events, want 2", len(got))
	}
}

func testListGroups(t *testing.T, e *env) {
	if gs, err := e.s.ListGroups(e.ctx); err != nil || len(gs) != 0 {
		t.Fatalf("empty outbox: %v, %v", gs, err)
	}
	t0 := e.clock.Now()
	if err := e.s.RegisterGroup(e.ctx, "orders", "billing", "Order.Placed", "Order.Paid"); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Second)
	if err := e.s.RegisterGroup(e.ctx, "orders", "audit"); err != nil {
		t.Fatal(err)
	}
	if err := e.s.RegisterGroup(e.ctx, "orders", "billing", "Order.Refunded"); err != nil {
		t.Fatal(err)
	}
	if err := e.s.RegisterGroup(e.ctx, "payments", "ledger", "Payment.Taken"); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Second)
	tEnqueue := e.clock.Now()
	e.enqueueAll(kindEvent("orders", "o1", "Order.Placed"), kindEvent("orders", "o2", "Order.Placed"),
		kindEvent("orders", "o3", "Order.Shipped"), kindEvent("plain", "p1", "Thing"))
	e.clock.Advance(time.Second)
	tAck := e.clock.Now()
	// billing: o1 delivered, o2 dead. audit: o1 processing, o2 o3 pending.
	b := e.claim(outbox.ClaimRequest{Stream: "orders", Group: "billing", Worker: "w", Limit: 10, Lease: time.Minute, MaxAttempts: 1})
	if len(b) != 2 {
		t.Fatalf("billing claim: %v", b)
	}
	if err := e.s.Acknowledge(e.ctx, b[0].Receipt()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Fail(e.ctx, b[1].Receipt(), outbox.Failure{Reason: "no", MaxAttempts: 1}); err != nil {
		t.Fatal(err)
	}
	e.claimOne(outbox.ClaimRequest{Stream: "orders", Group: "audit", Worker: "w", Lease: time.Minute, MaxAttempts: 3})
	// A group that was registered, got a row and was unregistered.
	if err := e.s.RegisterGroup(e.ctx, "orders", "old-name", "Order.Placed"); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Second)
	tLate := e.clock.Now()
	e.enqueue(kindEvent("orders", "o4", "Order.Placed"))
	if err := e.s.UnregisterGroup(e.ctx, "orders", "old-name"); err != nil {
		t.Fatal(err)
	}

	gs, err := e.s.ListGroups(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, g := range gs {
		names = append(names, g.Stream+"/"+g.Group)
	}
	if want := []string{"orders/audit", "orders/billing", "orders/old-name", "payments/ledger", "plain/"}; !slices.Equal(names, want) {
		t.Fatalf("groups %q, want %q", names, want)
	}
	want := []outbox.GroupInfo{
		{Stream: "orders", Group: "audit", Registered: true, AllKinds: true, RegisteredAt: t0.Add(time.Second),
			Pending: 3, Processing: 1, LastEnqueuedAt: tLate},
		{Stream: "orders", Group: "billing", Registered: true, Kinds: []string{"Order.Paid", "Order.Placed", "Order.Refunded"}, RegisteredAt: t0,
			Dead: 1, Delivered: 1, Pending: 1, LastEnqueuedAt: tLate, LastDeliveredAt: tAck},
		{Stream: "orders", Group: "old-name", Pending: 1, LastEnqueuedAt: tLate},
		{Stream: "payments", Group: "ledger", Registered: true, Kinds: []string{"Payment.Taken"}, RegisteredAt: t0.Add(time.Second)},
		{Stream: "plain", Group: "", Pending: 1, LastEnqueuedAt: tEnqueue},
	}
	for i, w := range want {
		g := gs[i]
		if g.Stream != w.Stream || g.Group != w.Group || g.Registered != w.Registered || g.AllKinds != w.AllKinds ||
			!slices.Equal(g.Kinds, w.Kinds) || !g.RegisteredAt.Equal(w.RegisteredAt) ||
			g.Pending != w.Pending || g.Processing != w.Processing || g.Dead != w.Dead || g.Delivered != w.Delivered ||
			!g.LastEnqueuedAt.Equal(w.LastEnqueuedAt) || !g.LastDeliveredAt.Equal(w.LastDeliveredAt) {
			t.Errorf("group %d:\n got %+v\nwant %+v", i, g, w)
		}
	}
	if gs[0].Backlog() != 4 {
		t.Errorf("audit backlog %d, want 4", gs[0].Backlog())
	}

	// A stream filter; registrations alone.
	if gs, err := e.s.ListGroups(e.ctx, "payments", "plain"); err != nil || len(gs) != 2 || gs[0].Group != "ledger" || gs[1].Group != "" {
		t.Fatalf("ListGroups(payments, plain): %+v, %v", gs, err)
	}
	regs, err := e.s.RegisteredGroups(e.ctx, "orders")
	if err != nil || len(regs) != 2 || regs[0].Group != "audit" || !regs[0].AllKinds || regs[1].Group != "billing" ||
		!slices.Equal(regs[1].Kinds, []string{"Order.Paid", "Order.Placed", "Order.Refunded"}) || !regs[1].RegisteredAt.Equal(t0) {
		t.Fatalf("RegisteredGroups(orders): %+v, %v", regs, err)
	}
	if regs, err := e.s.RegisteredGroups(e.ctx); err != nil || len(regs) != 3 {
		t.Fatalf("RegisteredGroups(): %+v, %v", regs, err)
	}
	for _, bad := range []string{"", "bad stream"} {
		if _, err := e.s.ListGroups(e.ctx, bad); !errors.Is(err, outbox.ErrInvalidKey) {
			t.Errorf("ListGroups(%q): want ErrInvalidKey, got %v", bad, err)
		}
		if _, err := e.s.RegisteredGroups(e.ctx, bad); !errors.Is(err, outbox.ErrInvalidKey) {
			t.Errorf("RegisteredGroups(%q): want ErrInvalidKey, got %v", bad, err)
		}
	}
}

func testRetireGroup(t *testing.T, e *env) {
	for _, g := range []string{"billing", "audit"} {
		if err := e.s.RegisterGroup(e.ctx, "orders", g); err != nil {
			t.Fatal(err)
		}
	}
	e.enqueueAll(event("orders", "o1"), event("orders", "o2"), event("orders", "o3"))
	breq := outbox.ClaimRequest{Stream: "orders", Group: "billing", Worker: "w", Limit: 10, Lease: time.Minute, MaxAttempts: 1}
	retire := outbox.RetireRequest{Stream: "orders", Group: "billing"}

	// Pending events: refused, nothing changes.
	res, err := e.s.RetireGroup(e.ctx, retire)
	if !errors.Is(err, outbox.ErrGroupNotDrained) || res != (outbox.Retired{Pending: 3}) {
		t.Fatalf("retire with 3 pending: %+v, %v; want ErrGroupNotDrained and the counts", res, err)
	}
	if got := e.registered("orders"); !slices.Equal(got, []string{"audit", "billing"}) {
		t.Fatalf("a refused retire removed the registration: %q", got)
	}
	// Claimed (processing) events also hold it back.
	cs := e.claim(breq)
	if len(cs) != 3 {
		t.Fatalf("claim: %v", cs)
	}
	res, err = e.s.RetireGroup(e.ctx, retire)
	if !errors.Is(err, outbox.ErrGroupNotDrained) || res != (outbox.Retired{Processing: 3}) {
		t.Fatalf("retire with 3 processing: %+v, %v", res, err)
	}
	// Deliver one, dead-letter two: dead letters do not hold it back, and stay.
	if err := e.s.Acknowledge(e.ctx, cs[0].Receipt()); err != nil {
		t.Fatal(err)
	}
	for _, c := range cs[1:] {
		if _, err := e.s.Fail(e.ctx, c.Receipt(), outbox.Failure{Reason: "no", MaxAttempts: 1}); err != nil {
			t.Fatal(err)
		}
	}
	res, err = e.s.RetireGroup(e.ctx, retire)
	if err != nil || res != (outbox.Retired{Unregistered: true, Dead: 2}) {
		t.Fatalf("retire a drained group: %+v, %v", res, err)
	}
	if got := e.registered("orders"); !slices.Equal(got, []string{"audit"}) {
		t.Fatalf("registrations after retire: %q", got)
	}
	if n := e.groupRows("orders", "billing", outbox.StatusDead); n != 2 {
		t.Fatalf("dead letters of the retired group: %d, want 2 kept", n)
	}
	if n := e.groupRows("orders", "billing", outbox.StatusDelivered); n != 1 {
		t.Fatalf("delivered rows of the retired group: %d, want 1 kept", n)
	}
	// New events are no longer written for it; audit is untouched.
	e.enqueue(event("orders", "o4"))
	if n := e.groupRows("orders", "billing", ""); n != 3 {
		t.Fatalf("billing rows after a later enqueue: %d, want 3", n)
	}
	if n := e.groupRows("orders", "audit", outbox.StatusPending); n != 4 {
		t.Fatalf("audit pending: %d, want 4", n)
	}
	// Retiring it again, or a group that never existed, is ErrGroupNotRegistered.
	for _, r := range []outbox.RetireRequest{retire, {Stream: "orders", Group: "nobody"}, {Stream: "elsewhere", Group: "audit"}} {
		if res, err := e.s.RetireGroup(e.ctx, r); !errors.Is(err, outbox.ErrGroupNotRegistered) || res != (outbox.Retired{}) {
			t.Errorf("retire %+v: %+v, %v; want ErrGroupNotRegistered", r, res, err)
		}
	}
	// With Discard, the retired group's dead letters go (delivered rows stay).
	res, err = e.s.RetireGroup(e.ctx, outbox.RetireRequest{Stream: "orders", Group: "billing", Discard: true})
	if err != nil || res != (outbox.Retired{Dead: 2}) {
		t.Fatalf("discard the retired group's dead letters: %+v, %v", res, err)
	}
	if n := e.groupRows("orders", "billing", ""); n != 1 {
		t.Fatalf("billing rows after discard: %d, want the delivered one", n)
	}
	// Bad input.
	for _, r := range []outbox.RetireRequest{{Stream: "orders", Group: ""}, {Stream: "", Group: "audit"}, {Stream: "orders", Group: "bad group"}} {
		if _, err := e.s.RetireGroup(e.ctx, r); !errors.Is(err, outbox.ErrInvalidKey) {
			t.Errorf("retire %+v: want ErrInvalidKey, got %v", r, err)
		}
	}
	if got := e.registered("orders"); !slices.Equal(got, []string{"audit"}) {
		t.Fatalf("registrations at the end: %q", got)
	}
}

func testRetireGroupDiscard(t *testing.T, e *env) {
	for _, g := range []string{"old-name", "keeper"} {
		if err := e.s.RegisterGroup(e.ctx, "orders", g); err != nil {
			t.Fatal(err)
		}
	}
	// More events than one chunk, so the discard takes several transactions.
	const n = 1005
	evs := make([]outbox.Event, n)
	for i := range evs {
		evs[i] = event("orders", fmt.Sprintf("o%04d", i))
	}
	e.enqueueAll(evs...)
	req := outbox.ClaimRequest{Stream: "orders", Group: "old-name", Worker: "w", Limit: 3, Lease: time.Minute, MaxAttempts: 1}
	cs := e.claim(req)
	if err := e.s.Acknowledge(e.ctx, cs[0].Receipt()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Fail(e.ctx, cs[1].Receipt(), outbox.Failure{Reason: "no", MaxAttempts: 1}); err != nil {
		t.Fatal(err)
	}
	held := cs[2] // still processing
	res, err := e.s.RetireGroup(e.ctx, outbox.RetireRequest{Stream: "orders", Group: "old-name", Discard: true})
	if err != nil || res != (outbox.Retired{Unregistered: true, Pending: n - 3, Processing: 1, Dead: 1}) {
		t.Fatalf("retire with discard: %+v, %v", res, err)
	}
	if got := e.groupRows("orders", "old-name", ""); got != 1 {
		t.Fatalf("old-name rows left: %d, want the delivered one", got)
	}
	if got := e.groupRows("orders", "keeper", outbox.StatusPending); got != n {
		t.Fatalf("keeper pending: %d, want %d untouched", got, n)
	}
	if got := e.registered("orders"); !slices.Equal(got, []string{"keeper"}) {
		t.Fatalf("registrations: %q", got)
	}
	// The consumer that held a discarded event finds its claim stale.
	if err := e.s.Acknowledge(e.ctx, held.Receipt()); !errors.Is(err, outbox.ErrStaleClaim) {
		t.Fatalf("ack of a discarded event: want ErrStaleClaim, got %v", err)
	}
	// The keys stay known through keeper's rows: enqueuing one again is a no-op.
	if again := e.enqueue(evs[5]); again.Inserted {
		t.Fatalf("re-enqueue after the discard inserted %+v", again)
	}
}

func testDiscardDead(t *testing.T, e *env) {
	if err := e.s.RegisterGroup(e.ctx, "orders", "billing"); err != nil {
		t.Fatal(err)
	}
	if err := e.s.RegisterGroup(e.ctx, "orders", "audit"); err != nil {
		t.Fatal(err)
	}
	e.enqueueAll(kindEvent("orders", "o1", "A"), kindEvent("orders", "o2", "A"), kindEvent("orders", "o3", "B"), kindEvent("orders", "o4", "B"))
	e.enqueueAll(kindEvent("plain", "p1", "A"), kindEvent("plain", "p2", "B"))
	billingDead := e.deadLetterAll("orders", "billing") // o1..o4
	auditDead := e.deadLetterAll("orders", "audit")     // o1..o4
	plainDead := e.deadLetterAll("plain", "")           // p1, p2
	live := e.enqueue(kindEvent("orders", "o5", "A"))   // pending in both groups
	if len(billingDead) != 4 || len(auditDead) != 4 || len(plainDead) != 2 {
		t.Fatalf("dead letters: %v %v %v", billingDead, auditDead, plainDead)
	}
	discard := func(sel outbox.DeadSelector, want int64) {
		t.Helper()
		n, err := e.s.DiscardDead(e.ctx, sel)
		if err != nil || n != want {
			t.Fatalf("DiscardDead(%+v): %d, %v; want %d", sel, n, err, want)
		}
	}
	// By id: only dead letters of the stream; others are left alone.
	discard(outbox.DeadSelector{Stream: "orders", IDs: []int64{auditDead[3], billingDead[0], live.ID, plainDead[0], 999999, billingDead[0]}}, 2)
	e.expectRow(live.ID, outbox.StatusPending, 0)
	if e.row(plainDead[0]).Status != outbox.StatusDead {
		t.Fatal("a dead letter of another stream was discarded")
	}
	for _, id := range []int64{auditDead[3], billingDead[0]} {
		if r := e.row(id); r.Status != "<no row>" {
			t.Fatalf("row %d still there: %+v", id, r)
		}
	}
	// By kind within a group: billing's B letters (o3, o4), not audit's.
	discard(outbox.DeadSelector{Stream: "orders", Group: "billing", Kind: "B"}, 2)
	if n := e.groupRows("orders", "billing", outbox.StatusDead); n != 1 {
		t.Fatalf("billing dead after discarding kind B: %d, want 1 (o2)", n)
	}
	if n := e.groupRows("orders", "audit", outbox.StatusDead); n != 3 {
		t.Fatalf("audit dead: %d, want 3", n)
	}
	// Nothing matches: 0, no error.
	discard(outbox.DeadSelector{Stream: "orders", Group: "billing", Kind: "B"}, 0)
	discard(outbox.DeadSelector{Stream: "orders", Group: "nobody", All: true}, 0)
	discard(outbox.DeadSelector{Stream: "orders", IDs: []int64{live.ID}}, 0)
	// All of a group, and all of the default group.
	discard(outbox.DeadSelector{Stream: "orders", Group: "audit", All: true}, 3)
	discard(outbox.DeadSelector{Stream: "plain", Group: "", All: true}, 2)
	if n := e.count("SELECT COUNT(*) FROM millpond_outbox WHERE status = 'dead_letter'"); n != 1 {
		t.Fatalf("dead letters left: %d, want billing's o2", n)
	}
	if d, err := e.s.ListDead(e.ctx, outbox.DeadQuery{Stream: "orders", AllGroups: true, Limit: 10}); err != nil || len(d) != 1 || d[0].Key != "o2" || d[0].Group != "billing" {
		t.Fatalf("ListDead after discards: %v, %v", d, err)
	}
	e.expectRow(live.ID, outbox.StatusPending, 0)

	// Selectors: exactly one of ids, kind, all; ids without a group.
	tooMany := make([]int64, outbox.MaxBatch+1)
	for i := range tooMany {
		tooMany[i] = int64(i + 1)
	}
	for _, c := range []struct {
		sel  outbox.DeadSelector
		want error
	}{
		{outbox.DeadSelector{Stream: "orders"}, outbox.ErrInvalidSelector},
		{outbox.DeadSelector{Stream: "orders", Group: "billing"}, outbox.ErrInvalidSelector},
		{outbox.DeadSelector{Stream: "orders", Kind: "A", All: true}, outbox.ErrInvalidSelector},
		{outbox.DeadSelector{Stream: "orders", IDs: []int64{1}, All: true}, outbox.ErrInvalidSelector},
		{outbox.DeadSelector{Stream: "orders", IDs: []int64{1}, Kind: "A"}, outbox.ErrInvalidSelector},
		{outbox.DeadSelector{Stream: "orders", IDs: []int64{1}, Group: "billing"}, outbox.ErrInvalidSelector},
		{outbox.DeadSelector{Stream: "", All: true}, outbox.ErrInvalidKey},
		{outbox.DeadSelector{Stream: "orders", Group: "bad group", All: true}, outbox.ErrInvalidKey},
		{outbox.DeadSelector{Stream: "orders", Kind: "bad kind"}, outbox.ErrInvalidKey},
		{outbox.DeadSelector{Stream: "orders", IDs: []int64{0}}, outbox.ErrInvalidID},
		{outbox.DeadSelector{Stream: "orders", IDs: []int64{-4}}, outbox.ErrInvalidID},
		{outbox.DeadSelector{Stream: "orders", IDs: tooMany}, outbox.ErrInvalidBatch},
	} {
		if n, err := e.s.DiscardDead(e.ctx, c.sel); !errors.Is(err, c.want) || n != 0 {
			t.Errorf("DiscardDead(%+v): %d, %v; want %v", c.sel, n, err, c.want)
		}
	}
	if n := e.count("SELECT COUNT(*) FROM millpond_outbox WHERE status = 'dead_letter'"); n != 1 {
		t.Fatalf("refused selectors discarded something: %d dead letters left", n)
	}
}

// deadLetterMany dead-letters every pending event of the group through
// lease expiry, which takes a few statements whatever the count.
func (e *env) deadLetterMany(stream, group string) {
	e.t.Helper()
	req := outbox.ClaimRequest{Stream: stream, Group: group, Worker: "w", Limit: outbox.MaxBatch, Lease: time.Second, MaxAttempts: 1}
	for len(e.claim(req)) > 0 {
		// claim everything once
	}
	e.clock.Advance(2 * time.Second)
	for e.groupRows(stream, group, outbox.StatusProcessing) > 0 {
		e.expectNothingDue(req) // expired final attempts are dead-lettered
	}
}

func testDiscardDeadChunks(t *testing.T, e *env) {
	const n = 2 * 1005
	evs := make([]outbox.Event, n)
	for i := range evs {
		kind := "A"
		if i%2 == 1 {
			kind = "B"
		}
		evs[i] = kindEvent("s", fmt.Sprintf("k%04d", i), kind)
	}
	e.enqueueAll(evs...)
	e.deadLetterMany("s", "")
	if got := e.groupRows("s", "", outbox.StatusDead); got != n {
		t.Fatalf("dead letters: %d, want %d", got, n)
	}
	// CountDead counts what they would discard, across chunks, and
	// deletes nothing.
	for _, c := range []struct {
		sel  outbox.DeadSelector
		want int64
	}{{outbox.DeadSelector{Stream: "s", Kind: "B"}, n / 2}, {outbox.DeadSelector{Stream: "s", All: true}, n}, {outbox.DeadSelector{Stream: "s", Group: "g", All: true}, 0}} {
		if got, err := e.s.CountDead(e.ctx, c.sel); err != nil || got != c.want {
			t.Fatalf("CountDead(%+v): %d, %v; want %d", c.sel, got, err, c.want)
		}
	}
	if _, err := e.s.CountDead(e.ctx, outbox.DeadSelector{Stream: "s", IDs: []int64{1}}); !errors.Is(err, outbox.ErrInvalidSelector) {
		t.Fatalf("CountDead by ids: %v, want ErrInvalidSelector", err)
	}
	if got := e.groupRows("s", "", outbox.StatusDead); got != n {
		t.Fatalf("dead letters after CountDead: %d, want %d", got, n)
	}
	if got, err := e.s.DiscardDead(e.ctx, outbox.DeadSelector{Stream: "s", Kind: "B"}); err != nil || got != n/2 {
		t.Fatalf("discard kind B: %d, %v; want %d", got, err, n/2)
	}
	if got, err := e.s.DiscardDead(e.ctx, outbox.DeadSelector{Stream: "s", All: true}); err != nil || got != n/2 {
		t.Fatalf("discard all: %d, %v; want %d", got, err, n/2)
	}
	if got := e.groupRows("s", "", ""); got != 0 {
		t.Fatalf("rows left: %d", got)
	}
}

func testReroutePending(t *testing.T, e *env) {
	// Before any group exists, everything lands in the default group.
	t0 := e.clock.Now()
	a1 := kindEvent("orders", "a1", "A")
	a3 := kindEvent("orders", "a3", "A")
	a3.Delay = time.Hour
	ids := e.enqueueAll(a1, kindEvent("orders", "a2", "A"), a3, kindEvent("orders", "b1", "B"), kindEvent("orders", "c1", "C"))
	e.enqueue(kindEvent("other", "x1", "A"))
	e.clock.Advance(time.Second)
	// a2 is claimed (processing) from the default group: it stays. a1 was
	// claimed too and released, so it is pending again.
	cs := e.claim(outbox.ClaimRequest{Stream: "orders", Worker: "w", Limit: 2, Lease: time.Minute, MaxAttempts: 3})
	if len(cs) != 2 || cs[0].Key != "a1" || cs[1].Key != "a2" || cs[0].ID != ids[0] {
		t.Fatalf("claim: %v", cs)
	}
	if n, err := e.s.Release(e.ctx, cs[0].Receipt()); err != nil || n != 1 {
		t.Fatalf("release: %d, %v", n, err)
	}
	// No group takes anything yet: nothing moves.
	if n, err := e.s.ReroutePending(e.ctx, "orders"); err != nil || n != 0 {
		t.Fatalf("reroute with no groups: %d, %v", n, err)
	}

	if err := e.s.RegisterGroup(e.ctx, "orders", "billing", "A"); err != nil {
		t.Fatal(err)
	}
	if err := e.s.RegisterGroup(e.ctx, "orders", "shipping", "B"); err != nil {
		t.Fatal(err)
	}
	// A registration of the default group itself takes nothing (as for Reroute).
	if err := e.s.RegisterGroup(e.ctx, "orders", "", "C"); err != nil {
		t.Fatal(err)
	}
	if err := e.s.RegisterGroup(e.ctx, "other", "elsewhere"); err != nil {
		t.Fatal(err)
	}
	n, err := e.s.ReroutePending(e.ctx, "orders")
	if err != nil || n != 3 {
		t.Fatalf("reroute: %d, %v; want a1, a3, b1", n, err)
	}
	keys := func(group string) []string {
		t.Helper()
		var out []string
		for _, k := range []string{"a1", "a2", "a3", "b1", "c1"} {
			if e.count("SELECT COUNT(*) FROM millpond_outbox WHERE stream = 'orders' AND consumer_group = ? AND event_key = ?", group, k) == 1 {
				out = append(out, k)
			}
		}
		return out
	}
	for g, want := range map[string][]string{"": {"a2", "c1"}, "billing": {"a1", "a3"}, "shipping": {"b1"}} {
		if got := keys(g); !slices.Equal(got, want) {
			t.Errorf("group %q holds %q, want %q", g, got, want)
		}
	}
	if n := e.groupRows("other", "", outbox.StatusPending); n != 1 {
		t.Fatalf("another stream's event moved: %d left", n)
	}
	// The moved events are pending, with fresh attempts, their creation time
	// and due time, payload and metadata.
	if n := e.count("SELECT COUNT(*) FROM millpond_outbox WHERE consumer_group IN ('billing', 'shipping') AND status = 'pending' AND attempts = 0 AND created_at = ?", t0.UnixMicro()); n != 3 {
		t.Fatalf("moved rows pending with 0 attempts and the original created_at: %d, want 3", n)
	}
	if n := e.count("SELECT COUNT(*) FROM millpond_outbox WHERE consumer_group = 'billing' AND event_key = 'a3' AND available_at = ?", t0.Add(time.Hour).UnixMicro()); n != 1 {
		t.Fatal("the delayed event lost its delay")
	}
	got := e.claim(outbox.ClaimRequest{Stream: "orders", Group: "billing", Worker: "w", Limit: 10, Lease: time.Minute, MaxAttempts: 3})
	if len(got) != 1 || got[0].Key != "a1" || string(got[0].Payload) != `{"key":"a1"}` || got[0].Metadata["trace"] != "a1" || got[0].Attempts != 1 {
		t.Fatalf("billing claim after the move: %v (the delayed a3 must wait)", got)
	}
	// The key stays known: enqueuing a1 again changes nothing.
	if again := e.enqueue(a1); again.Inserted {
		t.Fatalf("re-enqueue of a moved event inserted: %+v", again)
	}
	// The held a2 settles normally in the default group.
	if err := e.s.Acknowledge(e.ctx, cs[1].Receipt()); err != nil {
		t.Fatalf("ack of the held event: %v", err)
	}

	// A group for every kind now takes c1; nothing else is left.
	if err := e.s.RegisterGroup(e.ctx, "orders", "audit"); err != nil {
		t.Fatal(err)
	}
	if n, err := e.s.ReroutePending(e.ctx, "orders"); err != nil || n != 1 {
		t.Fatalf("reroute to an all-kinds group: %d, %v; want c1", n, err)
	}
	if got := keys("audit"); !slices.Equal(got, []string{"c1"}) {
		t.Fatalf("audit holds %q", got)
	}
	if n, err := e.s.ReroutePending(e.ctx, "orders"); err != nil || n != 0 {
		t.Fatalf("reroute with nothing left: %d, %v", n, err)
	}
	for _, bad := range []string{"", "bad stream"} {
		if _, err := e.s.ReroutePending(e.ctx, bad); !errors.Is(err, outbox.ErrInvalidKey) {
			t.Errorf("ReroutePending(%q): want ErrInvalidKey, got %v", bad, err)
		}
	}
}

func testReroutePendingChunks(t *testing.T, e *env) {
	const n = 1005
	evs := make([]outbox.Event, 0, n+1)
	for i := range n {
		evs = append(evs, kindEvent("s", fmt.Sprintf("k%04d", i), "A"))
	}
	evs = append(evs, kindEvent("s", "other-kind", "B"))
	e.enqueueAll(evs...)
	for _, g := range []string{"one", "two"} {
		if err := e.s.RegisterGroup(e.ctx, "s", g, "A"); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := e.s.ReroutePending(e.ctx, "s"); err != nil || got != n {
		t.Fatalf("reroute: %d, %v; want %d", got, err, n)
	}
	for g, want := range map[string]int64{"one": n, "two": n, "": 1} {
		if got := e.groupRows("s", g, outbox.StatusPending); got != want {
			t.Errorf("group %q: %d pending, want %d", g, got, want)
		}
	}
}

// Discards of overlapping dead letters, given in random orders from several
// goroutines at once, neither deadlock nor delete a row twice.
func testConcurrentDiscards(t *testing.T, e *env) {
	const n = 300
	e.enqueueAll(keyedEvents("s", n)...)
	var ids []int64
	for {
		cs := e.claim(outbox.ClaimRequest{Stream: "s", Worker: "w", Limit: 100, Lease: time.Minute, MaxAttempts: 1})
		if len(cs) == 0 {
			break
		}
		for _, c := range cs {
			if _, err := e.s.Fail(e.ctx, c.Receipt(), outbox.Failure{Reason: "no", MaxAttempts: 1}); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, c.ID)
		}
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total int64
		errs  []error
	)
	for w := range 6 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for range 5 {
				pick := slices.Clone(ids)
				r.Shuffle(len(pick), func(i, j int) { pick[i], pick[j] = pick[j], pick[i] })
				pick = pick[:n/2]
				var got int64
				var err error
				if w == 0 {
					got, err = e.s.DiscardDead(e.ctx, outbox.DeadSelector{Stream: "s", All: true})
				} else {
					got, err = e.s.DiscardDead(e.ctx, outbox.DeadSelector{Stream: "s", IDs: pick})
				}
				mu.Lock()
				total += got
				if err != nil {
					errs = append(errs, err)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d discards failed, first: %v", len(errs), errs[0])
	}
	if total != n {
		t.Fatalf("discards reported %d deletions of %d rows", total, n)
	}
	if left := e.groupRows("s", "", ""); left != 0 {
		t.Fatalf("%d rows left", left)
	}
}

func testSchemaVersion(t *testing.T, e *env) {
	ms, err := outbox.Migrations(e.db.Dialect)
	if err != nil {
		t.Fatal(err)
	}
	latest := ms[len(ms)-1].Version
	if v, err := e.s.SchemaVersion(e.ctx); err != nil || v != latest {
		t.Fatalf("schema version of a migrated database: %d, %v; want %d", v, err, latest)
	}
	if res, err := e.s.MigrateReport(e.ctx); err != nil || len(res.Applied) != 0 || res.Version != latest {
		t.Fatalf("migrate an up-to-date schema: %+v, %v", res, err)
	}
	if err := e.s.MigrateDown(e.ctx); err != nil {
		t.Fatal(err)
	}
	if v, err := e.s.SchemaVersion(e.ctx); err != nil || v != 0 {
		t.Fatalf("schema version without the schema: %d, %v; want 0", v, err)
	}
	res, err := e.s.MigrateReport(e.ctx)
	if err != nil || res.Version != latest || len(res.Applied) != len(ms) {
		t.Fatalf("first migrate: %+v, %v", res, err)
	}
	for i, m := range res.Applied {
		if m.Version != ms[i].Version || m.Name != ms[i].Name {
			t.Errorf("applied[%d] = %d %s, want %d %s", i, m.Version, m.Name, ms[i].Version, ms[i].Name)
		}
	}
	if v, err := e.s.SchemaVersion(e.ctx); err != nil || v != latest {
		t.Fatalf("schema version after migrate: %d, %v", v, err)
	}
}
