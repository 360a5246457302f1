package tests

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// TestHeldClaim checks Store.ClaimHeld on PostgreSQL and MariaDB: held
// events are skipped by other claims and unchanged until Settle, which
// acknowledges (ordered events hand their keys over), leases or leaves
// each one; Abort, an idle holder and a dead holder leave them due again,
// unchanged.
func TestHeldClaim(t *testing.T) {
	for _, dialect := range []string{"postgres", "mysql"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			testHeldClaims(t, dialect)
		})
	}
}

func testHeldClaims(t *testing.T, dialect string) {
	for _, deleteOnAck := range []bool{false, true} {
		name := "KeepDelivered"
		var opts []outbox.Option
		if deleteOnAck {
			name, opts = "DeleteOnAck", []outbox.Option{outbox.WithDeleteOnAck()}
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, dialect, false, opts...)
			e.deleteOnAck = deleteOnAck
			testHeldSettle(t, e)
		})
	}
	for name, test := range map[string]func(*testing.T, *env){
		"Abort":                               testHeldAbort,
		"Refusals":                            testHeldRefusals,
		"FailedHeadKeepsItsKey":               testHeldFailedHead,
		"ProducerCommitsOnTheKeyDuringSettle": testHeldSettleRacesProducer,
		"ClaimContextEndsBeforeSettle":        testHeldClaimContext,
		"IdleHolderIsEnded":                   testHeldIdle,
		"KilledHolder":                        testHeldKilled,
		"ClaimsReadPastHeldEvents":            testHeldReadPast,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			test(t, newEnv(t, dialect, false))
		})
	}
	t.Run("ExhaustedEventsAreDeadLettered", func(t *testing.T) {
		t.Parallel()
		testHeldExhausted(t, newEnv(t, dialect, true))
	})
}

// TestHeldClaimRestoresTheSession: a MySQL held claim's session gets its
// wait_timeout back when the claim settles or aborts (also when Settle's
// context has ended before it begins), so the pooled
// connection does not carry the claim's into the application's
// transactions.
func TestHeldClaimRestoresTheSession(t *testing.T) {
	e := newEnv(t, "mysql", false)
	e.db.SQL.SetMaxOpenConns(1) // every statement below runs on the held claim's connection
	if _, err := e.db.SQL.ExecContext(e.ctx, "SET SESSION wait_timeout = 12345"); err != nil {
		t.Fatal(err)
	}
	expectWaitTimeout := func(when string) {
		t.Helper()
		var got int
		if err := e.db.SQL.QueryRowContext(e.ctx, "SELECT @@SESSION.wait_timeout").Scan(&got); err != nil || got != 12345 {
			t.Fatalf("%s: want the session's wait_timeout 12345 back, got %d, %v", when, got, err)
		}
	}
	req := claimReq("s", 10, 3*time.Second, 5)
	for i, end := range []string{"settle", "abort", "settle leasing"} {
		e.enqueue(event("s", "e"+strconv.Itoa(i)))
		h, cs := e.claimHeld(req)
		if len(cs) == 0 {
			t.Fatal("held claim: nothing held")
		}
		var err error
		switch end {
		case "settle":
			_, err = h.Settle(e.ctx, ids(cs), nil)
		case "abort":
			err = h.Abort()
		default:
			_, err = h.Settle(e.ctx, nil, ids(cs))
		}
		if err != nil {
			t.Fatalf("%s: %v", end, err)
		}
		expectWaitTimeout("after " + end)
	}
	// A settle whose context has ended gives the session back too: its
	// transaction must not be rolled back behind its back (database/sql
	// rolls back a transaction whose context ends and keeps the
	// connection), before the wait_timeout is restored. The race is
	// narrow: try it many times.
	for i := range 200 {
		if i < 10 {
			e.enqueue(event("s", "c"+strconv.Itoa(i)))
		}
		h, cs := e.claimHeld(req)
		if len(cs) == 0 {
			t.Fatal("held claim: nothing held")
		}
		ctx, cancel := context.WithCancel(e.ctx)
		cancel()
		if _, err := h.Settle(ctx, ids(cs), nil); !errors.Is(err, context.Canceled) {
			t.Fatalf("settle with an ended context: want context.Canceled, got %v", err)
		}
		expectWaitTimeout("after a settle with an ended context, try " + strconv.Itoa(i))
		if err := h.Abort(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestHeldClaimOverServerPreparedStatements: an application's own *sql.DB
// opened without interpolateParams sends every statement with arguments as
// a server-side prepared statement; held claims work over it too (their
// session SET, JSON lists, lease and acknowledgement).
func TestHeldClaimOverServerPreparedStatements(t *testing.T) {
	db := testdb.New(t, "mysql")
	e := &env{t: t, ctx: context.Background(), db: db, s: mysqlStoreAt(t, db.URL+"?interpolateParams=false", 0)}
	if err := e.s.Migrate(e.ctx); err != nil {
		t.Fatal(err)
	}
	prepares := func() int64 {
		var name string
		var n int64
		if err := db.SQL.QueryRowContext(e.ctx, "SHOW GLOBAL STATUS LIKE 'Com_stmt_prepare'").Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := prepares()
	testHeldSettle(t, e)
	testHeldAbort(t, e)
	if n := prepares() - before; n < 10 {
		t.Fatalf("the server prepared %d statements: the store did not use server-side prepared statements", n)
	}
}

// TestHeldClaimUnsupported: SQLite holds no claims.
func TestHeldClaimUnsupported(t *testing.T) {
	e := newEnv(t, "sqlite", false)
	e.enqueue(event("s", "a"))
	h, cs, err := e.s.ClaimHeld(e.ctx, claimReq("s", 10, time.Minute, 5))
	if !errors.Is(err, errors.ErrUnsupported) || h != nil || cs != nil {
		t.Fatalf("held claim on SQLite: want errors.ErrUnsupported, got %v, %v, %v", h, cs, err)
	}
	e.expectRow(1, outbox.StatusPending, 0)
}

func (e *env) claimHeld(req outbox.ClaimRequest) (*outbox.HeldClaim, []outbox.Claimed) {
	e.t.Helper()
	h, cs, err := e.s.ClaimHeld(e.ctx, req)
	if err != nil {
		e.t.Fatalf("held claim: %v", err)
	}
	if h != nil {
		// A test that fails with the claim open must not leave its rows
		// locked: the schema's cleanup would wait for them.
		e.t.Cleanup(func() { _ = h.Abort() })
	}
	return h, cs
}

// ids are the claimed events' ids, in order.
func ids(cs []outbox.Claimed) []int64 {
	return project(cs, func(c outbox.Claimed) int64 { return c.ID })
}

// project maps each claimed event to one of its fields.
func project[T any](cs []outbox.Claimed, field func(outbox.Claimed) T) []T {
	out := make([]T, len(cs))
	for i, c := range cs {
		out[i] = field(c)
	}
	return out
}

func testHeldSettle(t *testing.T, e *env) {
	var unordered []int64
	for i := range 6 {
		unordered = append(unordered, e.enqueue(event("s", "u"+strconv.Itoa(i))).ID)
	}
	var ordered []int64
	for i := range 3 {
		ev := event("s", "o"+strconv.Itoa(i))
		ev.OrderingKey = "order-1"
		ordered = append(ordered, e.enqueue(ev).ID)
	}
	req := claimReq("s", 100, time.Minute, 5)
	h, cs := e.claimHeld(req)
	want := append(slices.Clone(unordered), ordered[0]) // the key's head only
	if got := ids(cs); !slices.Equal(got, want) {
		t.Fatalf("held claim: want ids %v, got %v", want, got)
	}
	for _, c := range cs {
		if c.Attempts != 1 || c.ClaimKey != "" || c.Reclaimed || string(c.Payload) == "" || c.Stream != "s" {
			t.Fatalf("held event: want attempt 1, no claim key, content, got %+v", c)
		}
		if c.ID == ordered[0] && (c.OrderingKey != "order-1" || c.OrderingSeq != 1) {
			t.Fatalf("held head: want key order-1 seq 1, got %q %d", c.OrderingKey, c.OrderingSeq)
		}
	}
	// Held rows are unchanged and skipped by other claims.
	for _, id := range want {
		e.expectRow(id, outbox.StatusPending, 0)
	}
	e.expectNothingDue(req)

	delivered := []int64{unordered[0], unordered[1], unordered[2], unordered[3], ordered[0]}
	leased := []int64{unordered[4]}
	rs, err := h.Settle(e.ctx, delivered, leased)
	if err != nil {
		t.Fatalf("settle: %v", err)
	}
	if len(rs) != 1 || rs[0].ID != unordered[4] || len(rs[0].ClaimKey) != 32 {
		t.Fatalf("settle: want one receipt for %d with a claim key, got %+v", unordered[4], rs)
	}
	for _, id := range delivered {
		e.expectRow(id, outbox.StatusDelivered, 1)
	}
	if !e.deleteOnAck {
		if r := e.row(unordered[0]); r.ClaimKey != "" || !r.DeliveredAt.Valid {
			t.Fatalf("delivered row: want no claim key and a delivery time, got %+v", r)
		}
	}
	e.expectRow(unordered[4], outbox.StatusProcessing, 1)
	e.expectRow(unordered[5], outbox.StatusPending, 0) // left as it was
	e.expectRow(ordered[1], outbox.StatusPending, 0)   // the key's next event
	e.expectRow(ordered[2], outbox.StatusBlocked, 0)

	// The leased event is an ordinary claim: its receipt fails it.
	out, err := e.s.Fail(e.ctx, rs[0], outbox.Failure{Reason: "broker down", MaxAttempts: 5, RetryDelay: time.Hour})
	if err != nil || out.DeadLettered {
		t.Fatalf("fail the leased event: %+v, %v", out, err)
	}
	e.expectRow(unordered[4], outbox.StatusPending, 1)
	// The event left alone and the key's next event are due now.
	if got := ids(e.claim(req)); !slices.Equal(got, []int64{unordered[5], ordered[1]}) {
		t.Fatalf("claim after settle: want %v, got %v", []int64{unordered[5], ordered[1]}, got)
	}
}

func testHeldAbort(t *testing.T, e *env) {
	for i := range 3 {
		e.enqueue(event("s", "a"+strconv.Itoa(i)))
	}
	req := claimReq("s", 100, time.Minute, 5)
	h, cs := e.claimHeld(req)
	if len(cs) != 3 {
		t.Fatalf("held claim: want 3 events, got %d", len(cs))
	}
	if err := h.Abort(); err != nil {
		t.Fatalf("abort: %v", err)
	}
	if err := h.Abort(); err != nil {
		t.Fatalf("second abort: %v", err)
	}
	if _, err := h.Settle(e.ctx, ids(cs), nil); !errors.Is(err, outbox.ErrHeldSettled) {
		t.Fatalf("settle after abort: want ErrHeldSettled, got %v", err)
	}
	for _, c := range cs {
		e.expectRow(c.ID, outbox.StatusPending, 0)
	}
	if got := e.claim(req); len(got) != 3 || got[0].Attempts != 1 {
		t.Fatalf("claim after abort: want the 3 events at attempt 1, got %d", len(got))
	}
	// Nothing due: no claim is held.
	if h, cs := e.claimHeld(req); h != nil || len(cs) != 0 {
		t.Fatalf("held claim of nothing due: want nil, got %v %d", h, len(cs))
	}
}

func testHeldRefusals(t *testing.T, e *env) {
	a := e.enqueue(event("s", "a")).ID
	b := e.enqueue(event("s", "b")).ID
	req := claimReq("s", 1, time.Minute, 5)
	h, cs := e.claimHeld(req) // a only
	if len(cs) != 1 || cs[0].ID != a {
		t.Fatalf("held claim: want event %d, got %v", a, ids(cs))
	}
	for label, args := range map[string][2][]int64{
		"an id it does not hold": {{b}, nil},
		"an id twice":            {{a}, {a}},
	} {
		if _, err := h.Settle(e.ctx, args[0], args[1]); !errors.Is(err, outbox.ErrInvalidID) {
			t.Fatalf("settle with %s: want ErrInvalidID, got %v", label, err)
		}
	}
	if _, err := h.Settle(e.ctx, []int64{a}, nil); err != nil { // still open
		t.Fatalf("settle after refusals: %v", err)
	}
	e.expectRow(a, outbox.StatusDelivered, 1)
	if _, err := h.Settle(e.ctx, nil, nil); !errors.Is(err, outbox.ErrHeldSettled) {
		t.Fatalf("second settle: want ErrHeldSettled, got %v", err)
	}
	bad := req
	bad.Limit = 0
	if _, _, err := e.s.ClaimHeld(e.ctx, bad); !errors.Is(err, outbox.ErrInvalidBatch) {
		t.Fatalf("held claim of limit 0: want ErrInvalidBatch, got %v", err)
	}
}

// testHeldFailedHead: a held head of an ordering key whose publish failed
// is leased, then failed: it is retried later and its key's next event
// stays blocked behind it.
func testHeldFailedHead(t *testing.T, e *env) {
	var ordered []int64
	for i := range 2 {
		ev := event("s", "o"+strconv.Itoa(i))
		ev.OrderingKey = "order-1"
		ordered = append(ordered, e.enqueue(ev).ID)
	}
	req := claimReq("s", 10, time.Minute, 5)
	h, cs := e.claimHeld(req)
	if got := ids(cs); !slices.Equal(got, ordered[:1]) {
		t.Fatalf("held claim: want the head %d, got %v", ordered[0], got)
	}
	rs, err := h.Settle(e.ctx, nil, ordered[:1])
	if err != nil || len(rs) != 1 {
		t.Fatalf("settle the failed head: %v, %v", rs, err)
	}
	e.expectRow(ordered[0], outbox.StatusProcessing, 1)
	if _, err := e.s.Fail(e.ctx, rs[0], outbox.Failure{Reason: "broker down", MaxAttempts: 5, RetryDelay: time.Hour}); err != nil {
		t.Fatal(err)
	}
	e.expectRow(ordered[0], outbox.StatusPending, 1)
	e.expectRow(ordered[1], outbox.StatusBlocked, 0)
	e.expectNothingDue(req) // the head waits out its delay; its successor waits for it
}

// testHeldSettleRacesProducer: a settle that acknowledges a key's head
// while a producer of the key holds the key's row waits for it; when the
// producer commits, the head is acknowledged all the same (by the leased
// path the held acknowledgement falls back to) and the producer's event,
// the key's next, becomes pending.
func testHeldSettleRacesProducer(t *testing.T, e *env) {
	head := ordered("s", "o0", "order-1")
	id := e.enqueue(head).ID
	h, cs := e.claimHeld(claimReq("s", 10, time.Minute, 5))
	if got := ids(cs); !slices.Equal(got, []int64{id}) {
		t.Fatalf("held claim: want the head %d, got %v", id, got)
	}
	tx, commit, rollback := e.db.Begin(t)
	next, err := e.s.Enqueue(e.ctx, tx, ordered("s", "o1", "order-1"))
	if err != nil {
		rollback()
		t.Fatal(err)
	}
	settled := make(chan error, 1)
	go func() {
		_, err := h.Settle(e.ctx, []int64{id}, nil)
		settled <- err
	}()
	e.waitForLockWait("settle behind the producer")
	if err := commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-settled; err != nil {
		t.Fatalf("settle: %v", err)
	}
	e.expectRow(id, outbox.StatusDelivered, 1)
	e.expectRow(next.ID, outbox.StatusPending, 0)
}

// testHeldExhausted: a due event whose attempts are used up (its last
// lease expired) is dead-lettered by a held claim, as by a leased one, not
// handed out again.
func testHeldExhausted(t *testing.T, e *env) {
	a := e.enqueue(event("s", "a")).ID
	req := claimReq("s", 10, time.Minute, 1)
	if got := e.claim(req); len(got) != 1 {
		t.Fatalf("leased claim: want 1 event, got %d", len(got))
	}
	e.clock.Advance(2 * time.Minute) // the lease expires after the only attempt
	h, cs := e.claimHeld(req)
	if h != nil || len(cs) != 0 {
		t.Fatalf("held claim of an exhausted event: want nothing held, got %v", ids(cs))
	}
	e.expectRow(a, outbox.StatusDead, 1)
	if r := e.row(a); r.LastError != "lease expired after the final attempt" {
		t.Fatalf("dead letter: want the lease's expiry as its error, got %q", r.LastError)
	}
	b := e.enqueue(event("s", "b")).ID
	if got := e.claim(req); len(got) != 1 || got[0].ID != b {
		t.Fatalf("leased claim of b: %v", ids(got))
	}
	e.clock.Advance(2 * time.Minute)
	c := e.enqueue(event("s", "c")).ID
	h, cs = e.claimHeld(req)
	if got := ids(cs); !slices.Equal(got, []int64{c}) {
		t.Fatalf("held claim: want only %d (%d dead-lettered), got %v", c, b, got)
	}
	// The dead letter is written in the held claim's transaction: it
	// commits with the settle.
	if _, err := h.Settle(e.ctx, []int64{c}, nil); err != nil {
		t.Fatal(err)
	}
	e.expectRow(b, outbox.StatusDead, 1)
	e.expectRow(c, outbox.StatusDelivered, 1)
}

// testHeldClaimContext: the claim's context bounds the claim only; the
// held claim stays open after it ends, and Settle's context bounds Settle.
func testHeldClaimContext(t *testing.T, e *env) {
	id := e.enqueue(event("s", "a")).ID
	ctx, cancel := context.WithCancel(e.ctx)
	h, cs, err := e.s.ClaimHeld(ctx, claimReq("s", 10, time.Minute, 5))
	cancel()
	if err != nil || len(cs) != 1 {
		t.Fatalf("held claim: %d events, %v", len(cs), err)
	}
	t.Cleanup(func() { _ = h.Abort() })
	done, cancelled := context.WithCancel(e.ctx)
	cancelled()
	if _, err := h.Settle(done, []int64{id}, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("settle with an ended context: want context.Canceled, got %v", err)
	}
	e.expectRow(id, outbox.StatusPending, 0)
	id2 := e.enqueue(event("s", "b")).ID
	ctx, cancel = context.WithCancel(e.ctx)
	h, cs, err = e.s.ClaimHeld(ctx, claimReq("s", 10, time.Minute, 5))
	cancel()
	if err != nil || len(cs) != 2 {
		t.Fatalf("second held claim: %d events, %v", len(cs), err)
	}
	if _, err := h.Settle(e.ctx, []int64{id, id2}, nil); err != nil {
		t.Fatalf("settle after the claim's context ended: %v", err)
	}
	e.expectRow(id, outbox.StatusDelivered, 1)
	e.expectRow(id2, outbox.StatusDelivered, 1)
}

// testHeldIdle: a holder idle for longer than its lease loses its claim.
func testHeldIdle(t *testing.T, e *env) {
	id := e.enqueue(event("s", "a")).ID
	req := claimReq("s", 10, outbox.MinLease, 5)
	h, cs := e.claimHeld(req)
	if len(cs) != 1 {
		t.Fatalf("held claim: want 1 event, got %d", len(cs))
	}
	began := time.Now()
	for {
		got := e.claim(claimReq("s", 10, time.Minute, 5))
		if len(got) == 1 && got[0].ID == id {
			break
		}
		if len(got) != 0 || time.Since(began) > 10*time.Second {
			t.Fatalf("claim while the holder idled: want event %d once its lease passed, got %v", id, ids(got))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if waited := time.Since(began); waited < outbox.MinLease-100*time.Millisecond {
		t.Fatalf("the idle holder lost its claim after %v, before its lease of %v", waited, outbox.MinLease)
	}
	if _, err := h.Settle(e.ctx, []int64{id}, nil); err == nil {
		t.Fatal("settle of a claim the database ended: want an error")
	}
	e.expectRow(id, outbox.StatusProcessing, 1) // the other claim's
}

// testHeldKilled: when the holder's session dies, its events are due at
// once, unchanged.
func testHeldKilled(t *testing.T, e *env) {
	e.enqueue(event("s", "a"))
	e.enqueue(event("s", "b"))
	req := claimReq("s", 10, time.Hour, 5)
	h, cs := e.claimHeld(req)
	if len(cs) != 2 {
		t.Fatalf("held claim: want 2 events, got %d", len(cs))
	}
	e.killHolder()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := e.claim(claimReq("s", 10, time.Minute, 5))
		if len(got) == 2 {
			if got[0].Attempts != 1 {
				t.Fatalf("claim after the holder died: want attempt 1 (unchanged rows), got %d", got[0].Attempts)
			}
			break
		}
		if len(got) != 0 || time.Now().After(deadline) {
			t.Fatalf("claim after the holder died: want both events, got %v", ids(got))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := h.Settle(e.ctx, ids(cs), nil); err == nil {
		t.Fatal("settle of a claim whose session died: want an error")
	}
}

// killHolder ends the session of the test's one held claim.
func (e *env) killHolder() {
	e.t.Helper()
	if e.db.Dialect == "mysql" {
		// The holder's session is the one of this test's database whose
		// open transaction locks rows.
		var thread int64
		err := e.db.SQL.QueryRowContext(e.ctx, `SELECT t.trx_mysql_thread_id FROM information_schema.INNODB_TRX t
JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id
WHERE p.DB = DATABASE() AND t.trx_rows_locked > 0`).Scan(&thread)
		if err == nil {
			_, err = e.db.SQL.ExecContext(e.ctx, "KILL "+strconv.FormatInt(thread, 10))
		}
		if err != nil {
			e.t.Fatalf("kill the holder's session: %v", err)
		}
		return
	}
	// The holder's session is the one idle in a transaction that holds a
	// row-share lock (FOR UPDATE) on this test's table.
	var killed int
	err := e.db.Pool.QueryRow(e.ctx, `SELECT COUNT(*) FILTER (WHERE pg_terminate_backend(l.pid))
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.relation = 'millpond_deliveries'::regclass AND l.mode = 'RowShareLock' AND l.granted AND a.state = 'idle in transaction'`).Scan(&killed)
	if err != nil || killed != 1 {
		e.t.Fatalf("terminate the holder's session: want 1 session ended, got %d, %v", killed, err)
	}
}

// testHeldReadPast: held events stay pending while they are held, yet a
// claim of as many events as are held before the due ones takes due ones,
// leased or held, instead of coming back empty behind them.
func testHeldReadPast(t *testing.T, e *env) {
	var all []int64
	for i := range 12 {
		all = append(all, e.enqueue(event("s", "e"+strconv.Itoa(i))).ID)
	}
	req := claimReq("s", 3, time.Minute, 5)
	_, first := e.claimHeld(req)
	_, second := e.claimHeld(req)
	leased := e.claim(req)
	_, third := e.claimHeld(req)
	for i, got := range [][]int64{ids(first), ids(second), ids(leased), ids(third)} {
		if want := all[3*i : 3*i+3]; !slices.Equal(got, want) {
			t.Fatalf("claim %d of 3 events behind %d held ones: want %v, got %v", i+1, 3*i, want, got)
		}
	}
}
