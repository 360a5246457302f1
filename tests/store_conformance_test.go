package tests

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// TestStoreConformance runs one suite of store tests against every dialect
// in testdb.Dialects, the way riverqueue/river runs one driver suite against
// each driver. Every case gets its own isolated database.
func TestStoreConformance(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			for _, c := range conformanceCases {
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					c.run(t, newEnv(t, dialect, !c.dbClock))
				})
			}
		})
	}
}

type conformanceCase struct {
	name string
	// dbClock leaves the database clock in charge instead of injecting a
	// controllable one.
	dbClock bool
	run     func(t *testing.T, e *env)
}

var conformanceCases = []conformanceCase{
	{name: "ConcurrentClaimersDeliverExactlyOnce", dbClock: true, run: testConcurrentClaimers},
	{name: "StaleOrWrongClaimKeyChangesNothing", run: testStaleClaimKey},
	{name: "ClaimKeysDifferPerRowAndClaim", run: testClaimKeysDiffer},
	{name: "ExpiredLeaseIsReclaimed", run: testExpiredLease},
	{name: "RollbackLeavesNoEventCommitMakesVisible", run: testRollbackCommit},
	{name: "InTxCommitsOrRollsBack", run: testInTx},
	{name: "AttemptLimitDeadLettersAndRequeue", run: testAttemptLimit},
	{name: "LeaseExpiryAtFinalAttemptDeadLetters", run: testLeaseExpiryFinalAttempt},
	{name: "IdempotentEnqueue", run: testIdempotentEnqueue},
	{name: "RacingEnqueuesOfOneKeyMakeOneEvent", run: testRacingEnqueues},
	{name: "Bounds", run: testBounds},
	{name: "SanitizedErrorTextIsAccepted", run: testSanitizedErrorText},
	{name: "Redaction", run: testRedaction},
	{name: "ExtendMovesLease", run: testExtend},
	{name: "ReleaseDoesNotCountAttempt", run: testRelease},
	{name: "PurgeDeletesOnlyOldDelivered", run: testPurge},
	{name: "Stats", run: testStats},
	{name: "ConsumerGroups", run: testConsumerGroups},
	{name: "ConsumerGroupsByKind", run: testConsumerGroupsByKind},
	{name: "GroupOfEveryKindAndOfTheKindGetsOneRow", run: testGroupOfEveryKindAndKind},
	{name: "Migrations", run: testMigrations},
	{name: "MetadataAndBinaryPayloadRoundTrip", run: testRoundTrip},
	{name: "ClaimOrderAndBatchAcknowledge", run: testClaimOrderAndBatchAck},
	{name: "ClaimLowerBound", run: testClaimLowerBound},
	{name: "DelaysHoldEventsBack", run: testDelays},
	{name: "DatabaseClockLeases", dbClock: true, run: testDatabaseClock},
	{name: "MultiRowStatementsLockInIDOrder", run: testLockOrder},
	{name: "ClaimsReadOnlyWhatTheyTake", dbClock: true, run: testClaimsReadOnlyWhatTheyTake},
}

// fakeClock is a controllable clock for outbox.WithClock.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// env is one test's isolated database, its store and its clock.
type env struct {
	t     *testing.T
	ctx   context.Context
	db    *testdb.Database
	s     *outbox.Store
	clock *fakeClock // nil when the database clock is used
	// deleteOnAck: the store deletes acknowledged rows (WithDeleteOnAck),
	// so expectRow takes a delivered row to be one that is gone.
	deleteOnAck bool
}

func newEnv(t *testing.T, dialect string, injectClock bool, extra ...outbox.Option) *env {
	db := testdb.New(t, dialect)
	e := &env{t: t, ctx: context.Background(), db: db}
	opts := append([]outbox.Option{outbox.WithoutListen()}, extra...)
	if injectClock {
		e.clock = &fakeClock{now: time.Date(2031, 3, 14, 15, 9, 26, 535_000_000, time.UTC)}
		opts = append(opts, outbox.WithClock(e.clock.Now))
	}
	e.s = db.Store(t, opts...)
	return e
}

// q turns ? placeholders into $n for PostgreSQL.
func (e *env) q(query string) string {
	if e.db.Dialect != "postgres" {
		return query
	}
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func (e *env) count(query string, args ...any) int64 {
	e.t.Helper()
	return e.db.Count(e.t, e.q(query), args...)
}

// rowState is the delivery state of one row, read directly from the table.
type rowState struct {
	Status      string
	Attempts    int
	ClaimKey    string
	AvailableAt int64
	LastError   string
	DeliveredAt sql.NullInt64
}

func (e *env) row(id int64) rowState {
	e.t.Helper()
	query := e.q("SELECT status, attempts, claim_key, available_at, last_error, delivered_at FROM millpond_outbox WHERE id = ?")
	var r rowState
	var err error
	dest := []any{&r.Status, &r.Attempts, &r.ClaimKey, &r.AvailableAt, &r.LastError, &r.DeliveredAt}
	if e.db.Pool != nil {
		err = e.db.Pool.QueryRow(e.ctx, query, id).Scan(dest...)
	} else {
		err = e.db.SQL.QueryRowContext(e.ctx, query, id).Scan(dest...)
	}
	if errors.Is(err, sql.ErrNoRows) || err != nil && strings.Contains(err.Error(), "no rows") {
		return rowState{Status: "<no row>"}
	}
	if err != nil {
		e.t.Fatalf("read row %d: %v", id, err)
	}
	return r
}

// expectRow asserts status and attempts with db.Count.
func (e *env) expectRow(id int64, status string, attempts int) {
	e.t.Helper()
	if status == outbox.StatusDelivered && e.deleteOnAck {
		if n := e.count("SELECT COUNT(*) FROM millpond_deliveries WHERE id = ?", id); n != 0 {
			e.t.Fatalf("row %d: want it deleted on acknowledgement, got %+v", id, e.row(id))
		}
		return
	}
	if n := e.count("SELECT COUNT(*) FROM millpond_outbox WHERE id = ? AND status = ? AND attempts = ?", id, status, attempts); n != 1 {
		e.t.Fatalf("row %d: want status %s attempts %d, got %+v", id, status, attempts, e.row(id))
	}
}

func (e *env) enqueue(ev outbox.Event) outbox.Enqueued {
	e.t.Helper()
	tx, commit, rollback := e.db.Begin(e.t)
	res, err := e.s.Enqueue(e.ctx, tx, ev)
	if err != nil {
		rollback()
		e.t.Fatalf("enqueue: %v", err)
	}
	if err := commit(); err != nil {
		e.t.Fatalf("commit: %v", err)
	}
	return res
}

// enqueueErr enqueues in a transaction that is rolled back, returning the error.
func (e *env) enqueueErr(tx outbox.Tx, ev outbox.Event) error {
	_, err := e.s.Enqueue(e.ctx, tx, ev)
	return err
}

func event(stream, key string) outbox.Event {
	return outbox.Event{Stream: stream, Key: key, Kind: "Thing.Happened", Payload: []byte(`{"key":"` + key + `"}`)}
}

func claimReq(stream string, limit int, lease time.Duration, maxAttempts int) outbox.ClaimRequest {
	return outbox.ClaimRequest{Stream: stream, Worker: "worker-1", Limit: limit, Lease: lease, MaxAttempts: maxAttempts}
}

func (e *env) claim(req outbox.ClaimRequest) []outbox.Claimed {
	e.t.Helper()
	out, err := e.s.Claim(e.ctx, req)
	if err != nil {
		e.t.Fatalf("claim: %v", err)
	}
	return out
}

func (e *env) claimOne(req outbox.ClaimRequest) outbox.Claimed {
	e.t.Helper()
	req.Limit = 1
	out := e.claim(req)
	if len(out) != 1 {
		e.t.Fatalf("claim: want 1 event, got %d", len(out))
	}
	return out[0]
}

func (e *env) expectNothingDue(req outbox.ClaimRequest) {
	e.t.Helper()
	if out := e.claim(req); len(out) != 0 {
		e.t.Fatalf("claim: want nothing due, got %d events (first id %d)", len(out), out[0].ID)
	}
}

const wrongClaimKey = "0123456789abcdef0123456789abcdef"

func testConcurrentClaimers(t *testing.T, e *env) {
	const (
		events   = 2000
		claimers = 8
		batch    = 25
	)
	tx, commit, _ := e.db.Begin(t)
	ids := map[int64]bool{}
	for i := range events {
		res, err := e.s.Enqueue(e.ctx, tx, event("load", fmt.Sprintf("ev-%04d", i)))
		if err != nil {
			t.Fatalf("enqueue %d: %v", i, err)
		}
		ids[res.ID] = true
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}
	if len(ids) != events {
		t.Fatalf("want %d distinct ids, got %d", events, len(ids))
	}

	var (
		mu        sync.Mutex
		delivered = map[int64]int{}
		acked     atomic.Int64
		stale     atomic.Int64
		wg        sync.WaitGroup
		errs      = make(chan error, claimers)
	)
	ctx, cancel := context.WithTimeout(e.ctx, 45*time.Second)
	defer cancel()
	for w := range claimers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := outbox.ClaimRequest{Stream: "load", Worker: fmt.Sprintf("w%d", w), Limit: batch, Lease: time.Minute, MaxAttempts: 3}
			for acked.Load() < events {
				if ctx.Err() != nil {
					errs <- fmt.Errorf("worker %d: timed out with %d acknowledged", w, acked.Load())
					return
				}
				got, err := e.s.Claim(ctx, req)
				if err != nil {
					errs <- fmt.Errorf("worker %d claim: %w", w, err)
					return
				}
				if len(got) == 0 {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				rs := make([]outbox.Receipt, len(got))
				mu.Lock()
				for i, c := range got {
					delivered[c.ID]++
					rs[i] = c.Receipt()
				}
				mu.Unlock()
				st, err := e.s.AcknowledgeBatch(ctx, rs)
				if err != nil {
					errs <- fmt.Errorf("worker %d ack: %w", w, err)
					return
				}
				stale.Add(int64(len(st)))
				acked.Add(int64(len(rs) - len(st)))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := stale.Load(); n != 0 {
		t.Errorf("want zero stale acknowledgements, got %d", n)
	}
	if len(delivered) != events {
		t.Errorf("want %d distinct events delivered, got %d", events, len(delivered))
	}
	for id, n := range delivered {
		if !ids[id] {
			t.Errorf("delivered unknown id %d", id)
		}
		if n != 1 {
			t.Errorf("event %d delivered %d times", id, n)
		}
	}
	if n := e.count("SELECT COUNT(*) FROM millpond_outbox WHERE status = 'delivered' AND attempts = 1"); n != events {
		t.Errorf("want %d rows delivered at the first attempt, got %d", events, n)
	}
}

// testClaimKeysDiffer: every row of a claim gets its own key (32 lowercase
// hex digits), a key of one row does not settle another row of the same
// claim, and the next claim of the same rows gets new keys.
func testClaimKeysDiffer(t *testing.T, e *env) {
	const n = 20
	for i := range n {
		e.enqueue(event("s", fmt.Sprintf("k%d", i)))
	}
	req := claimReq("s", n, time.Second, 5)
	keys := map[string]bool{}
	check := func(label string, got []outbox.Claimed) {
		t.Helper()
		if len(got) != n {
			t.Fatalf("%s: claimed %d of %d", label, len(got), n)
		}
		for _, c := range got {
			if len(c.ClaimKey) != 32 || strings.Trim(c.ClaimKey, "0123456789abcdef") != "" {
				t.Fatalf("%s: claim key of length %d is not 32 lowercase hex digits", label, len(c.ClaimKey))
			}
			if keys[c.ClaimKey] {
				t.Fatalf("%s: a claim key repeats", label)
			}
			keys[c.ClaimKey] = true
		}
	}
	first := e.claim(req)
	check("first claim", first)
	e.expectRefused("another row's key", outbox.Receipt{ID: first[0].ID, ClaimKey: first[1].ClaimKey})
	e.clock.Advance(2 * time.Second)
	second := e.claim(req)
	check("second claim", second)
	if _, err := e.s.AcknowledgeBatch(e.ctx, receiptsOfClaims(second)); err != nil {
		t.Fatal(err)
	}
}

func receiptsOfClaims(cs []outbox.Claimed) []outbox.Receipt {
	rs := make([]outbox.Receipt, len(cs))
	for i, c := range cs {
		rs[i] = c.Receipt()
	}
	return rs
}

func testStaleClaimKey(t *testing.T, e *env) {
	e.enqueue(event("s", "a"))
	req := claimReq("s", 1, time.Second, 5)
	first := e.claimOne(req)
	if first.Attempts != 1 || len(first.ClaimKey) != 32 {
		t.Fatalf("first claim: attempts %d, claim key length %d", first.Attempts, len(first.ClaimKey))
	}
	checkRefused := e.expectRefused

	checkRefused("wrong key", outbox.Receipt{ID: first.ID, ClaimKey: wrongClaimKey})
	checkRefused("wrong id", outbox.Receipt{ID: first.ID + 1000, ClaimKey: first.ClaimKey})
	e.expectRow(first.ID, outbox.StatusProcessing, 1)

	// The lease expires and another worker reclaims: the first key is dead.
	e.clock.Advance(2 * time.Second)
	second := e.claimOne(req)
	if second.ID != first.ID || second.Attempts != 2 || second.ClaimKey == first.ClaimKey {
		t.Fatalf("reclaim: got id %d attempts %d (same key: %v)", second.ID, second.Attempts, second.ClaimKey == first.ClaimKey)
	}
	checkRefused("earlier claim", first.Receipt())
	e.expectRow(first.ID, outbox.StatusProcessing, 2)
	if got := e.row(first.ID).ClaimKey; got != second.ClaimKey {
		t.Fatalf("row holds a claim key other than the live one")
	}

	// The live claim settles; settling it again is stale too.
	if err := e.s.Acknowledge(e.ctx, second.Receipt()); err != nil {
		t.Fatalf("acknowledge live claim: %v", err)
	}
	e.expectRow(first.ID, outbox.StatusDelivered, 2)
	checkRefused("already acknowledged", second.Receipt())
	checkRefused("earlier claim after ack", first.Receipt())
	e.expectRow(first.ID, outbox.StatusDelivered, 2)
}

func testExpiredLease(t *testing.T, e *env) {
	e.enqueue(event("s", "a"))
	req := claimReq("s", 10, time.Second, 5)
	first := e.claimOne(req)
	if want := e.clock.Now().Add(time.Second); !first.LeaseExpiresAt.Equal(want) {
		t.Fatalf("lease expires at %v, want %v", first.LeaseExpiresAt, want)
	}
	// Still leased: nobody else gets it, even at the last microsecond.
	e.clock.Advance(time.Second - time.Microsecond)
	e.expectNothingDue(req)
	e.clock.Advance(time.Microsecond)
	second := e.claimOne(req)
	if second.ID != first.ID || second.Attempts != 2 || second.ClaimKey == first.ClaimKey {
		t.Fatalf("reclaim: id %d attempts %d, key changed %v", second.ID, second.Attempts, second.ClaimKey != first.ClaimKey)
	}
	if err := e.s.Acknowledge(e.ctx, first.Receipt()); !errors.Is(err, outbox.ErrStaleClaim) {
		t.Fatalf("first key after reclaim: want ErrStaleClaim, got %v", err)
	}
	// An expired lease is stale even if nobody reclaimed it.
	e.clock.Advance(time.Second)
	e.expectRefused("expired, not reclaimed", second.Receipt())
	e.expectRow(first.ID, outbox.StatusProcessing, 2)
	third := e.claimOne(req)
	if third.Attempts != 3 {
		t.Fatalf("third claim: attempts %d", third.Attempts)
	}
	if err := e.s.Acknowledge(e.ctx, third.Receipt()); err != nil {
		t.Fatal(err)
	}
	e.expectRow(first.ID, outbox.StatusDelivered, 3)
}

func testRollbackCommit(t *testing.T, e *env) {
	tx, _, rollback := e.db.Begin(t)
	if _, err := e.s.Enqueue(e.ctx, tx, event("s", "rolled-back")); err != nil {
		t.Fatal(err)
	}
	rollback()
	e.expectNothingDue(claimReq("s", 10, time.Minute, 3))
	if n := e.count("SELECT COUNT(*) FROM millpond_outbox"); n != 0 {
		t.Fatalf("rolled-back enqueue left %d rows", n)
	}

	tx, commit, _ := e.db.Begin(t)
	res, err := e.s.Enqueue(e.ctx, tx, event("s", "committed"))
	if err != nil {
		t.Fatal(err)
	}
	// Not visible to other connections before commit. (A claim would wait
	// for the open writer on SQLite, so read instead.)
	if n := e.count("SELECT COUNT(*) FROM millpond_outbox"); n != 0 {
		t.Fatalf("uncommitted enqueue visible: %d rows", n)
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}
	got := e.claim(claimReq("s", 10, time.Minute, 3))
	if len(got) != 1 || got[0].ID != res.ID || got[0].Key != "committed" {
		t.Fatalf("after commit: want the committed event %d, got %v", res.ID, got)
	}
	if n := e.count("SELECT COUNT(*) FROM millpond_outbox"); n != 1 {
		t.Fatalf("want 1 row, got %d", n)
	}
}

// testInTx: Store.InTx commits what fn wrote when it returns nil, and
// nothing of it when fn returns an error (returned as it is) or panics (the
// panic goes on). Store calls made inside fn with fn's context go through.
func testInTx(t *testing.T, e *env) {
	enqueueIn := func(key string) func(ctx context.Context, tx *sql.Tx) error {
		return func(ctx context.Context, tx *sql.Tx) error {
			_, err := e.s.Enqueue(ctx, outbox.SQLTx(tx), event("s", key))
			return err
		}
	}
	errNo := errors.New("the handler said no")
	err := e.s.InTx(e.ctx, nil, func(ctx context.Context, tx *sql.Tx) error {
		if err := enqueueIn("refused")(ctx, tx); err != nil {
			return err
		}
		return fmt.Errorf("wrapped: %w", errNo)
	})
	if !errors.Is(err, errNo) {
		t.Fatalf("InTx returned %v, want fn's error", err)
	}
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v, want fn's panic", r)
			}
		}()
		_ = e.s.InTx(e.ctx, nil, func(ctx context.Context, tx *sql.Tx) error {
			if err := enqueueIn("panicked")(ctx, tx); err != nil {
				return err
			}
			panic("boom")
		})
		t.Fatal("InTx swallowed the panic")
	}()
	if n := e.count("SELECT COUNT(*) FROM millpond_outbox"); n != 0 {
		t.Fatalf("a failed or panicking InTx left %d rows", n)
	}
	if err := e.s.InTx(e.ctx, nil, nil); err == nil {
		t.Fatal("InTx accepted a nil function")
	}

	var inside []outbox.StreamStats
	var leftover context.Context
	err = e.s.InTx(e.ctx, nil, func(ctx context.Context, tx *sql.Tx) error {
		leftover = ctx
		if err := enqueueIn("committed")(ctx, tx); err != nil {
			return err
		}
		// A nested InTx would commit apart from this one: refused at once.
		if err := e.s.InTx(ctx, nil, enqueueIn("nested")); !errors.Is(err, outbox.ErrNestedTransaction) {
			return fmt.Errorf("nested InTx returned %v, want ErrNestedTransaction", err)
		}
		// A read of the store inside fn, with fn's context: on SQLite it
		// passes the write queue that InTx holds (it would wait for InTx
		// itself otherwise).
		readCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		var err error
		inside, err = e.s.Stats(readCtx)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(inside) != 0 {
		t.Fatalf("Stats inside fn saw uncommitted events: %+v", inside)
	}
	got := e.claim(claimReq("s", 10, time.Minute, 3))
	if len(got) != 1 || got[0].Key != "committed" {
		t.Fatalf("after InTx: want the committed event, got %v", got)
	}
	// Once InTx has returned, its context starts an InTx like any other.
	if err := e.s.InTx(leftover, nil, enqueueIn("after")); err != nil {
		t.Fatalf("InTx with an ended InTx's context: %v", err)
	}
}

func testAttemptLimit(t *testing.T, e *env) {
	res := e.enqueue(event("s", "doomed"))
	other := e.enqueue(event("s", "survivor"))
	req := claimReq("s", 1, time.Minute, 3)
	f := outbox.Failure{Reason: "handler said no", MaxAttempts: 3, RetryDelay: 0}
	for attempt := 1; attempt <= 3; attempt++ {
		c := e.claimOne(req)
		if c.ID != res.ID || c.Attempts != attempt {
			t.Fatalf("attempt %d: claimed id %d attempts %d", attempt, c.ID, c.Attempts)
		}
		out, err := e.s.Fail(e.ctx, c.Receipt(), f)
		if err != nil {
			t.Fatalf("attempt %d: fail: %v", attempt, err)
		}
		if out.DeadLettered != (attempt == 3) {
			t.Fatalf("attempt %d: DeadLettered = %v", attempt, out.DeadLettered)
		}
		if attempt < 3 {
			e.expectRow(res.ID, outbox.StatusPending, attempt)
		}
	}
	e.expectRow(res.ID, outbox.StatusDead, 3)
	if r := e.row(res.ID); r.LastError != "handler said no" {
		t.Fatalf("last error %q", r.LastError)
	}
	// The dead event is never claimed again; the other one still is.
	c := e.claimOne(req)
	if c.ID != other.ID {
		t.Fatalf("want the surviving event %d, got %d", other.ID, c.ID)
	}
	if err := e.s.Acknowledge(e.ctx, c.Receipt()); err != nil {
		t.Fatal(err)
	}
	e.expectNothingDue(req)

	dead, err := e.s.ListDead(e.ctx, outbox.DeadQuery{Stream: "s", Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(dead) != 1 || dead[0].ID != res.ID || dead[0].Attempts != 3 || dead[0].LastError != "handler said no" ||
		dead[0].Key != "doomed" || dead[0].Kind != "Thing.Happened" || dead[0].Stream != "s" {
		t.Fatalf("ListDead: %+v", dead)
	}
	if !dead[0].CreatedAt.Equal(e.clock.Now()) {
		t.Fatalf("dead event created at %v, want %v", dead[0].CreatedAt, e.clock.Now())
	}
	if d, err := e.s.ListDead(e.ctx, outbox.DeadQuery{Stream: "other", Limit: 10}); err != nil || len(d) != 0 {
		t.Fatalf("ListDead of another stream: %v, %v", d, err)
	}
	if d, err := e.s.ListDead(e.ctx, outbox.DeadQuery{Stream: "s", AfterID: res.ID, Limit: 10}); err != nil || len(d) != 0 {
		t.Fatalf("ListDead after the last id: %v, %v", d, err)
	}

	// Requeue in another stream changes nothing; in its own stream it resets.
	if n, err := e.s.Requeue(e.ctx, "other", res.ID); err != nil || n != 0 {
		t.Fatalf("requeue in another stream: %d, %v", n, err)
	}
	if n, err := e.s.Requeue(e.ctx, "s", res.ID, other.ID); err != nil || n != 1 {
		t.Fatalf("requeue: want 1 (the delivered one is not dead), got %d, %v", n, err)
	}
	e.expectRow(res.ID, outbox.StatusPending, 0)
	e.expectRow(other.ID, outbox.StatusDelivered, 1)
	c = e.claimOne(req)
	if c.ID != res.ID || c.Attempts != 1 {
		t.Fatalf("after requeue: id %d attempts %d", c.ID, c.Attempts)
	}
	if err := e.s.Acknowledge(e.ctx, c.Receipt()); err != nil {
		t.Fatal(err)
	}
	if d, err := e.s.ListDead(e.ctx, outbox.DeadQuery{Stream: "s", Limit: 10}); err != nil || len(d) != 0 {
		t.Fatalf("ListDead after requeue and delivery: %v, %v", d, err)
	}
}

func testLeaseExpiryFinalAttempt(t *testing.T, e *env) {
	res := e.enqueue(event("s", "slow"))
	req := claimReq("s", 10, time.Second, 2)
	for attempt := 1; attempt <= 2; attempt++ {
		c := e.claimOne(req)
		if c.Attempts != attempt {
			t.Fatalf("claim %d: attempts %d", attempt, c.Attempts)
		}
		e.clock.Advance(2 * time.Second) // the worker never settles
	}
	e.expectNothingDue(req)
	e.expectRow(res.ID, outbox.StatusDead, 2)
	if r := e.row(res.ID); r.LastError != "lease expired after the final attempt" {
		t.Fatalf("last error %q", r.LastError)
	}
	dead, err := e.s.ListDead(e.ctx, outbox.DeadQuery{Stream: "s", Limit: 10})
	if err != nil || len(dead) != 1 || dead[0].LastError != "lease expired after the final attempt" {
		t.Fatalf("ListDead: %v, %v", dead, err)
	}

	// A failed (not expired) event whose limit is lowered later keeps its
	// own failure text when the claim dead-letters it.
	res2 := e.enqueue(event("s", "lowered"))
	c := e.claimOne(claimReq("s", 1, time.Second, 5))
	if _, err := e.s.Fail(e.ctx, c.Receipt(), outbox.Failure{Reason: "first failure", MaxAttempts: 5}); err != nil {
		t.Fatal(err)
	}
	e.expectNothingDue(claimReq("s", 10, time.Second, 1))
	e.expectRow(res2.ID, outbox.StatusDead, 1)
	if r := e.row(res2.ID); r.LastError != "first failure" {
		t.Fatalf("last error %q", r.LastError)
	}
}

func testIdempotentEnqueue(t *testing.T, e *env) {
	ev := event("s", "k1")
	first := e.enqueue(ev)
	if !first.Inserted || first.ID <= 0 {
		t.Fatalf("first enqueue: %+v", first)
	}
	// Metadata is not part of the identity.
	again := ev
	again.Metadata = map[string]string{"trace": "other"}
	if res := e.enqueue(again); res.ID != first.ID || res.Inserted {
		t.Fatalf("same content: want id %d not inserted, got %+v", first.ID, res)
	}
	// Within the same transaction too.
	tx, commit, _ := e.db.Begin(t)
	for i := range 2 {
		res, err := e.s.Enqueue(e.ctx, tx, event("s", "k2"))
		if err != nil || res.Inserted != (i == 0) {
			t.Fatalf("same transaction enqueue %d: %+v, %v", i, res, err)
		}
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}

	otherPayload := ev
	otherPayload.Payload = []byte(`{"key":"different"}`)
	otherKind := ev
	otherKind.Kind = "Thing.Else"
	for name, bad := range map[string]outbox.Event{"payload": otherPayload, "kind": otherKind} {
		tx, _, rollback := e.db.Begin(t)
		err := e.enqueueErr(tx, bad)
		rollback()
		if !errors.Is(err, outbox.ErrIdempotencyConflict) {
			t.Fatalf("same key, other %s: want ErrIdempotencyConflict, got %v", name, err)
		}
	}
	// After a conflict inside a transaction, the transaction is still usable
	// (no statement failed on the database side).
	tx, commit, _ = e.db.Begin(t)
	if err := e.enqueueErr(tx, otherPayload); !errors.Is(err, outbox.ErrIdempotencyConflict) {
		t.Fatalf("want ErrIdempotencyConflict, got %v", err)
	}
	if _, err := e.s.Enqueue(e.ctx, tx, event("s", "k3")); err != nil {
		t.Fatalf("enqueue after conflict in the same transaction: %v", err)
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}

	elsewhere := e.enqueue(event("s2", "k1"))
	if !elsewhere.Inserted || elsewhere.ID == first.ID {
		t.Fatalf("same key in another stream: %+v", elsewhere)
	}
	if n := e.count("SELECT COUNT(*) FROM millpond_outbox"); n != 4 {
		t.Fatalf("want 4 rows (s/k1, s/k2, s/k3, s2/k1), got %d", n)
	}
	// The payload stored is the first one.
	c := e.claimOne(claimReq("s", 1, time.Minute, 3))
	if c.ID != first.ID || !bytes.Equal(c.Payload, ev.Payload) || len(c.Metadata) != 0 {
		t.Fatalf("claimed %d payload %q metadata %v", c.ID, c.Payload, c.Metadata)
	}
	// Delivered events still hold their key until purged.
	if err := e.s.Acknowledge(e.ctx, c.Receipt()); err != nil {
		t.Fatal(err)
	}
	if res := e.enqueue(ev); res.ID != first.ID || res.Inserted {
		t.Fatalf("re-enqueue of a delivered event: %+v", res)
	}
}

// testRacingEnqueues enqueues one key from two open transactions at once:
// the second waits for the first, then, once it commits, gets the same event
// (same content) or ErrIdempotencyConflict (other content), never a second
// event or a failed statement that would abort the caller's transaction.
func testRacingEnqueues(t *testing.T, e *env) {
	for _, tc := range []struct {
		name     string
		second   outbox.Event
		conflict bool
	}{
		{name: "same content", second: event("s", "race-1")},
		{name: "other content", second: outbox.Event{Stream: "s", Key: "race-2", Kind: "Thing.Else", Payload: []byte(`{}`)}, conflict: true},
	} {
		raceOnce(t, e, tc.name, event("s", tc.second.Key), tc.second, tc.conflict)
		if n := e.count(e.q("SELECT COUNT(*) FROM millpond_outbox WHERE event_key = ?"), tc.second.Key); n != 1 {
			t.Fatalf("%s: %d rows hold the key, want 1", tc.name, n)
		}
	}
}

// raceOnce enqueues first in one open transaction and second in another
// that starts while the first is open, then commits both; see
// testRacingEnqueues. Whatever fails, both transactions end, so the
// database can be dropped.
func raceOnce(t *testing.T, e *env, name string, first, second outbox.Event, conflict bool) {
	type outcome struct {
		tx       *outbox.Tx
		commit   func() error
		rollback func()
		res      outbox.Enqueued
		err      error
	}
	tx1, commit1, rollback1 := e.db.Begin(t)
	done := make(chan outcome, 1)
	var got outcome
	received := false
	defer func() {
		rollback1() // no-op once committed
		if !received {
			got = <-done // the second returns once the first has ended
		}
		if got.rollback != nil {
			got.rollback()
		}
	}()
	res1, err := e.s.Enqueue(e.ctx, tx1, first)
	if err != nil || !res1.Inserted {
		received = true
		t.Fatalf("%s: first enqueue: %+v, %v", name, res1, err)
	}
	go func() {
		// SQLite's BEGIN IMMEDIATE already waits for the first
		// transaction, so the second begins here too.
		tx2, commit2, rollback2, err := e.db.TryBegin()
		if err != nil {
			done <- outcome{err: err}
			return
		}
		res, err := e.s.Enqueue(e.ctx, tx2, second)
		done <- outcome{&tx2, commit2, rollback2, res, err}
	}()
	e.waitForLockWait(name)
	select {
	case got = <-done:
		received = true
		t.Fatalf("%s: the second enqueue returned before the first committed: %+v, %v", name, got.res, got.err)
	default:
	}
	if err := commit1(); err != nil {
		t.Fatalf("%s: commit first: %v", name, err)
	}
	select {
	case got = <-done:
		received = true
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: the second enqueue did not return after the first committed", name)
	}
	if got.tx == nil {
		t.Fatalf("%s: begin the second transaction: %v", name, got.err)
	}
	switch {
	case conflict && !errors.Is(got.err, outbox.ErrIdempotencyConflict):
		t.Fatalf("%s: want ErrIdempotencyConflict, got %+v, %v", name, got.res, got.err)
	case !conflict && (got.err != nil || got.res.Inserted || got.res.ID != res1.ID):
		t.Fatalf("%s: want event %d not inserted, got %+v, %v", name, res1.ID, got.res, got.err)
	}
	// The second transaction is still usable: nothing failed inside it.
	if _, err := e.s.Enqueue(e.ctx, *got.tx, event("s", second.Key+"-after")); err != nil {
		t.Fatalf("%s: enqueue after the race in the same transaction: %v", name, err)
	}
	if err := got.commit(); err != nil {
		t.Fatalf("%s: commit second: %v", name, err)
	}
}

// waitForLockWait returns once a transaction of this test's database waits
// on a lock (PostgreSQL) or runs its outbox or key-state insert (MySQL), so a race test
// knows its second transaction really is inside the database, waiting for
// the first. SQLite shows no lock waits; there it
// gives the second transaction a moment to reach BEGIN IMMEDIATE, which
// waits for the first to end.
func (e *env) waitForLockWait(label string) {
	e.t.Helper()
	var query string
	switch e.db.Dialect {
	case "postgres":
		query = "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
	case "mysql":
		// MariaDB lists a statement waiting on a row lock in the process
		// list, not always in INNODB_TRX: an enqueue, or an
		// acknowledgement counting a head off its key.
		query = `SELECT COUNT(*) FROM information_schema.PROCESSLIST
WHERE DB = DATABASE() AND ID <> CONNECTION_ID() AND (INFO LIKE 'INSERT INTO millpond_%' OR INFO LIKE 'UPDATE millpond_ordering%')`
	default:
		time.Sleep(100 * time.Millisecond)
		return
	}
	deadline := time.Now().Add(10 * time.Second)
	for e.count(query) == 0 {
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: the second transaction never waited on the first's lock", label)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func testBounds(t *testing.T, e *env) {
	e.enqueue(event("s", "live"))
	live := e.claimOne(claimReq("s", 1, time.Minute, 5))
	r := live.Receipt()
	tx, _, rollback := e.db.Begin(t)
	defer rollback()

	base := event("s", "k")
	withEvent := func(mut func(*outbox.Event)) func() error {
		return func() error {
			ev := base
			mut(&ev)
			_, err := e.s.Enqueue(e.ctx, tx, ev)
			return err
		}
	}
	withClaim := func(mut func(*outbox.ClaimRequest)) func() error {
		return func() error {
			req := claimReq("s", 1, time.Minute, 5)
			mut(&req)
			_, err := e.s.Claim(e.ctx, req)
			return err
		}
	}
	withFailure := func(mut func(*outbox.Failure)) func() error {
		return func() error {
			f := outbox.Failure{Reason: "x", MaxAttempts: 5, RetryDelay: time.Second}
			mut(&f)
			_, err := e.s.Fail(e.ctx, r, f)
			return err
		}
	}
	receipts := func(n int) []outbox.Receipt {
		out := make([]outbox.Receipt, n)
		for i := range out {
			out[i] = outbox.Receipt{ID: int64(i + 1), ClaimKey: wrongClaimKey}
		}
		return out
	}
	ids := func(n int) []int64 {
		out := make([]int64, n)
		for i := range out {
			out[i] = int64(i + 1)
		}
		return out
	}
	long := strings.Repeat("a", 129)
	maxKey := strings.Repeat("a", 128)
	bigMeta := map[string]string{"big": strings.Repeat("m", outbox.MaxMetadataBytes)}

	cases := []struct {
		name string
		call func() error
		want error
	}{
		{"stream empty", withEvent(func(ev *outbox.Event) { ev.Stream = "" }), outbox.ErrInvalidKey},
		{"stream 129 chars", withEvent(func(ev *outbox.Event) { ev.Stream = long }), outbox.ErrInvalidKey},
		{"stream bad char", withEvent(func(ev *outbox.Event) { ev.Stream = "a b" }), outbox.ErrInvalidKey},
		{"key empty", withEvent(func(ev *outbox.Event) { ev.Key = "" }), outbox.ErrInvalidKey},
		{"key 129 chars", withEvent(func(ev *outbox.Event) { ev.Key = long }), outbox.ErrInvalidKey},
		{"key bad char", withEvent(func(ev *outbox.Event) { ev.Key = "k/1" }), outbox.ErrInvalidKey},
		{"key non-ASCII", withEvent(func(ev *outbox.Event) { ev.Key = "kéy" }), outbox.ErrInvalidKey},
		{"kind empty", withEvent(func(ev *outbox.Event) { ev.Kind = "" }), outbox.ErrInvalidKey},
		{"kind 129 chars", withEvent(func(ev *outbox.Event) { ev.Kind = long }), outbox.ErrInvalidKey},
		{"kind bad char", withEvent(func(ev *outbox.Event) { ev.Kind = "Order Placed" }), outbox.ErrInvalidKey},
		{"payload over 1 MiB", withEvent(func(ev *outbox.Event) { ev.Payload = make([]byte, outbox.MaxPayloadBytes+1) }), outbox.ErrPayloadTooLarge},
		{"metadata empty key", withEvent(func(ev *outbox.Event) { ev.Metadata = map[string]string{"": "v"} }), outbox.ErrInvalidMetadata},
		{"metadata too large", withEvent(func(ev *outbox.Event) { ev.Metadata = bigMeta }), outbox.ErrInvalidMetadata},
		{"enqueue delay negative", withEvent(func(ev *outbox.Event) { ev.Delay = -time.Nanosecond }), outbox.ErrInvalidDelay},
		{"enqueue delay over 24h", withEvent(func(ev *outbox.Event) { ev.Delay = outbox.MaxDelay + time.Nanosecond }), outbox.ErrInvalidDelay},

		{"claim stream empty", withClaim(func(q *outbox.ClaimRequest) { q.Stream = "" }), outbox.ErrInvalidKey},
		{"claim group bad char", withClaim(func(q *outbox.ClaimRequest) { q.Group = "g!" }), outbox.ErrInvalidKey},
		{"claim worker empty", withClaim(func(q *outbox.ClaimRequest) { q.Worker = "" }), outbox.ErrInvalidKey},
		{"claim worker 129 chars", withClaim(func(q *outbox.ClaimRequest) { q.Worker = long }), outbox.ErrInvalidKey},
		{"lease under 1s", withClaim(func(q *outbox.ClaimRequest) { q.Lease = time.Second - time.Nanosecond }), outbox.ErrInvalidLease},
		{"lease zero", withClaim(func(q *outbox.ClaimRequest) { q.Lease = 0 }), outbox.ErrInvalidLease},
		{"lease over 1h", withClaim(func(q *outbox.ClaimRequest) { q.Lease = time.Hour + time.Nanosecond }), outbox.ErrInvalidLease},
		{"claim attempts 0", withClaim(func(q *outbox.ClaimRequest) { q.MaxAttempts = 0 }), outbox.ErrInvalidAttempts},
		{"claim attempts 101", withClaim(func(q *outbox.ClaimRequest) { q.MaxAttempts = 101 }), outbox.ErrInvalidAttempts},
		{"claim batch 0", withClaim(func(q *outbox.ClaimRequest) { q.Limit = 0 }), outbox.ErrInvalidBatch},
		{"claim batch 1001", withClaim(func(q *outbox.ClaimRequest) { q.Limit = 1001 }), outbox.ErrInvalidBatch},

		{"fail attempts 0", withFailure(func(f *outbox.Failure) { f.MaxAttempts = 0 }), outbox.ErrInvalidAttempts},
		{"fail attempts 101", withFailure(func(f *outbox.Failure) { f.MaxAttempts = 101 }), outbox.ErrInvalidAttempts},
		{"retry delay negative", withFailure(func(f *outbox.Failure) { f.RetryDelay = -time.Second }), outbox.ErrInvalidDelay},
		{"retry delay over 24h", withFailure(func(f *outbox.Failure) { f.RetryDelay = 24*time.Hour + time.Microsecond }), outbox.ErrInvalidDelay},
		{"failure text empty", withFailure(func(f *outbox.Failure) { f.Reason = "" }), outbox.ErrInvalidErrorText},
		{"failure text 513 bytes", withFailure(func(f *outbox.Failure) { f.Reason = strings.Repeat("e", 513) }), outbox.ErrInvalidErrorText},
		{"failure text newline", withFailure(func(f *outbox.Failure) { f.Reason = "line\nbreak" }), outbox.ErrInvalidErrorText},
		{"failure text NUL", withFailure(func(f *outbox.Failure) { f.Reason = "nul\x00" }), outbox.ErrInvalidErrorText},
		{"failure text DEL", withFailure(func(f *outbox.Failure) { f.Reason = "del\x7f" }), outbox.ErrInvalidErrorText},
		{"failure text C1 control", withFailure(func(f *outbox.Failure) { f.Reason = "c1\u0085" }), outbox.ErrInvalidErrorText},
		{"failure text invalid UTF-8", withFailure(func(f *outbox.Failure) { f.Reason = "bad\xff" }), outbox.ErrInvalidErrorText},

		{"ack batch 0", func() error { _, err := e.s.AcknowledgeBatch(e.ctx, nil); return err }, outbox.ErrInvalidBatch},
		{"ack batch 1001", func() error { _, err := e.s.AcknowledgeBatch(e.ctx, receipts(1001)); return err }, outbox.ErrInvalidBatch},
		{"extend batch 0", func() error { _, _, err := e.s.ExtendBatch(e.ctx, nil, time.Minute); return err }, outbox.ErrInvalidBatch},
		{"extend batch 1001", func() error { _, _, err := e.s.ExtendBatch(e.ctx, receipts(1001), time.Minute); return err }, outbox.ErrInvalidBatch},
		{"release batch 0", func() error { _, err := e.s.Release(e.ctx); return err }, outbox.ErrInvalidBatch},
		{"release batch 1001", func() error { _, err := e.s.Release(e.ctx, receipts(1001)...); return err }, outbox.ErrInvalidBatch},
		{"requeue batch 0", func() error { _, err := e.s.Requeue(e.ctx, "s"); return err }, outbox.ErrInvalidBatch},
		{"requeue batch 1001", func() error { _, err := e.s.Requeue(e.ctx, "s", ids(1001)...); return err }, outbox.ErrInvalidBatch},
		{"requeue bad stream", func() error { _, err := e.s.Requeue(e.ctx, "", 1); return err }, outbox.ErrInvalidKey},
		{"list dead batch 0", func() error { _, err := e.s.ListDead(e.ctx, outbox.DeadQuery{Stream: "s"}); return err }, outbox.ErrInvalidBatch},
		{"list dead batch 1001", func() error { _, err := e.s.ListDead(e.ctx, outbox.DeadQuery{Stream: "s", Limit: 1001}); return err }, outbox.ErrInvalidBatch},
		{"list dead bad stream", func() error { _, err := e.s.ListDead(e.ctx, outbox.DeadQuery{Stream: "a b", Limit: 1}); return err }, outbox.ErrInvalidKey},
		{"list dead negative after", func() error {
			_, err := e.s.ListDead(e.ctx, outbox.DeadQuery{Stream: "s", Limit: 1, AfterID: -1})
			return err
		}, outbox.ErrInvalidID},
		{"purge batch 0", func() error { _, err := e.s.Purge(e.ctx, time.Hour, 0); return err }, outbox.ErrInvalidBatch},
		{"purge batch over max", func() error { _, err := e.s.Purge(e.ctx, time.Hour, outbox.MaxPurgeBatch+1); return err }, outbox.ErrInvalidBatch},
		{"purge negative horizon", func() error { _, err := e.s.Purge(e.ctx, -time.Second, 10); return err }, outbox.ErrInvalidHorizon},

		{"ack id 0", func() error { return e.s.Acknowledge(e.ctx, outbox.Receipt{ID: 0, ClaimKey: r.ClaimKey}) }, outbox.ErrInvalidID},
		{"ack id negative", func() error { return e.s.Acknowledge(e.ctx, outbox.Receipt{ID: -1, ClaimKey: r.ClaimKey}) }, outbox.ErrInvalidID},
		{"fail id 0", func() error {
			_, err := e.s.Fail(e.ctx, outbox.Receipt{ClaimKey: r.ClaimKey}, outbox.Failure{Reason: "x", MaxAttempts: 1})
			return err
		}, outbox.ErrInvalidID},
		{"extend id 0", func() error {
			_, err := e.s.Extend(e.ctx, outbox.Receipt{ClaimKey: r.ClaimKey}, time.Minute)
			return err
		}, outbox.ErrInvalidID},
		{"release id 0", func() error { _, err := e.s.Release(e.ctx, outbox.Receipt{ClaimKey: r.ClaimKey}); return err }, outbox.ErrInvalidID},
		{"requeue id 0", func() error { _, err := e.s.Requeue(e.ctx, "s", 0); return err }, outbox.ErrInvalidID},
		{"requeue id negative", func() error { _, err := e.s.Requeue(e.ctx, "s", 1, -5); return err }, outbox.ErrInvalidID},
		{"ack batch with one id 0", func() error {
			_, err := e.s.AcknowledgeBatch(e.ctx, []outbox.Receipt{r, {ID: 0, ClaimKey: r.ClaimKey}})
			return err
		}, outbox.ErrInvalidID},

		{"claim key empty", func() error { return e.s.Acknowledge(e.ctx, outbox.Receipt{ID: r.ID}) }, outbox.ErrInvalidClaimKey},
		{"claim key short", func() error { return e.s.Acknowledge(e.ctx, outbox.Receipt{ID: r.ID, ClaimKey: r.ClaimKey[:31]}) }, outbox.ErrInvalidClaimKey},
		{"claim key long", func() error { return e.s.Acknowledge(e.ctx, outbox.Receipt{ID: r.ID, ClaimKey: r.ClaimKey + "0"}) }, outbox.ErrInvalidClaimKey},
		{"claim key upper case", func() error {
			return e.s.Acknowledge(e.ctx, outbox.Receipt{ID: r.ID, ClaimKey: strings.ToUpper(wrongClaimKey)})
		}, outbox.ErrInvalidClaimKey},
		{"claim key not hex", func() error {
			return e.s.Acknowledge(e.ctx, outbox.Receipt{ID: r.ID, ClaimKey: strings.Repeat("g", 32)})
		}, outbox.ErrInvalidClaimKey},
		{"claim key SQL", func() error {
			_, err := e.s.Fail(e.ctx, outbox.Receipt{ID: r.ID, ClaimKey: "' OR '1'='1' --                 "}, outbox.Failure{Reason: "x", MaxAttempts: 1})
			return err
		}, outbox.ErrInvalidClaimKey},
		{"extend lease under 1s", func() error { _, err := e.s.Extend(e.ctx, r, 999*time.Millisecond); return err }, outbox.ErrInvalidLease},
		{"extend lease over 1h", func() error { _, err := e.s.Extend(e.ctx, r, 61*time.Minute); return err }, outbox.ErrInvalidLease},
		{"register group bad", func() error { return e.s.RegisterGroup(e.ctx, "s", long) }, outbox.ErrInvalidKey},
		{"register group bad stream", func() error { return e.s.RegisterGroup(e.ctx, "", "g") }, outbox.ErrInvalidKey},
	}
	for _, c := range cases {
		err := c.call()
		if !errors.Is(err, c.want) {
			t.Errorf("%s: want %v, got %v", c.name, c.want, err)
		}
	}
	// Nothing above touched the live claim or wrote a row.
	e.expectRow(r.ID, outbox.StatusProcessing, 1)
	if n := e.count("SELECT COUNT(*) FROM millpond_outbox"); n != 1 {
		t.Fatalf("want 1 row, got %d", n)
	}

	// Every bound is inclusive at its edge.
	edge := outbox.Event{Stream: maxKey, Key: "Az09._:-" + strings.Repeat("k", 120), Kind: maxKey,
		Payload: bytes.Repeat([]byte{0xff}, outbox.MaxPayloadBytes), Delay: outbox.MaxDelay}
	if _, err := e.s.Enqueue(e.ctx, tx, edge); err != nil {
		t.Fatalf("enqueue at every bound: %v", err)
	}
	rollback() // SQLite: release the write lock before the store writes
	if _, err := e.s.Extend(e.ctx, r, outbox.MinLease); err != nil {
		t.Fatalf("extend by MinLease: %v", err)
	}
	if _, err := e.s.Extend(e.ctx, r, outbox.MaxLease); err != nil {
		t.Fatalf("extend by MaxLease: %v", err)
	}
	if _, err := e.s.Claim(e.ctx, outbox.ClaimRequest{Stream: maxKey, Group: maxKey, Worker: maxKey, Limit: outbox.MaxBatch, Lease: outbox.MaxLease, MaxAttempts: outbox.MaxAttempts}); err != nil {
		t.Fatalf("claim at every bound: %v", err)
	}
	if _, err := e.s.Fail(e.ctx, r, outbox.Failure{Reason: strings.Repeat("é", 256), MaxAttempts: outbox.MaxAttempts, RetryDelay: outbox.MaxDelay}); err != nil {
		t.Fatalf("fail at every bound: %v", err)
	}
	if got := e.row(r.ID); got.LastError != strings.Repeat("é", 256) || got.Status != outbox.StatusPending {
		t.Fatalf("after fail at the bounds: %+v", got)
	}
	if _, err := e.s.Purge(e.ctx, 0, outbox.MaxPurgeBatch); err != nil {
		t.Fatalf("purge at the bounds: %v", err)
	}
}

func testSanitizedErrorText(t *testing.T, e *env) {
	inputs := []string{
		"",
		"   ",
		"\x00\x01\x02",
		"panic: runtime error\n\tgoroutine 1 [running]:\n\tmain.go:12",
		"bad utf-8 \xff\xfe\xc3",
		"C1 control \u0085 and DEL \x7f",
		"zero width \u200b and bidi \u202e kept",
		strings.Repeat("x", 4096),
		strings.Repeat("é", 300),  // cut inside a 2-byte rune
		strings.Repeat("€", 200),  // 3-byte runes
		strings.Repeat("😀", 150),  // 4-byte runes
		strings.Repeat("\n", 600), // becomes empty after trimming
		"\t lead and trail \r\n",
		"quote ' and \" and \\ and ; DROP TABLE millpond_outbox; --",
	}
	e.enqueue(event("s", "failing"))
	req := claimReq("s", 1, time.Minute, outbox.MaxAttempts)
	for i, in := range inputs {
		text := outbox.SanitizeErrorText(in)
		if text == "" || len(text) > outbox.MaxErrorBytes {
			t.Fatalf("input %d: sanitized text has %d bytes", i, len(text))
		}
		c := e.claimOne(req)
		if _, err := e.s.Fail(e.ctx, c.Receipt(), outbox.Failure{Reason: text, MaxAttempts: outbox.MaxAttempts}); err != nil {
			t.Fatalf("input %d: Fail refused sanitized text %q: %v", i, text, err)
		}
		if got := e.row(c.ID).LastError; got != text {
			t.Fatalf("input %d: stored %q, want %q", i, got, text)
		}
	}
	if got := outbox.SanitizeErrorText("plain error"); got != "plain error" {
		t.Fatalf("plain text changed to %q", got)
	}
}

func testRedaction(t *testing.T, e *env) {
	const (
		stream  = "streamSECRETs1"
		key     = "keySECRETk1"
		payload = "payloadSECRETp1"
		group   = "groupSECRETg1"
	)
	if err := e.s.RegisterGroup(e.ctx, stream, group); err != nil {
		t.Fatal(err)
	}
	ev := outbox.Event{Stream: stream, Key: key, Kind: "Visible.Kind", Payload: []byte(payload), Metadata: map[string]string{"m": payload}}
	e.enqueue(ev)
	c := e.claimOne(outbox.ClaimRequest{Stream: stream, Group: group, Worker: "w", Lease: time.Minute, MaxAttempts: 1})
	if c.Stream != stream || c.Key != key || string(c.Payload) != payload || c.Group != group {
		t.Fatalf("claimed the wrong event: %q %q %q %q", c.Stream, c.Key, c.Payload, c.Group)
	}
	if _, err := e.s.Fail(e.ctx, c.Receipt(), outbox.Failure{Reason: "visible failure", MaxAttempts: 1}); err != nil {
		t.Fatal(err)
	}
	dead, err := e.s.ListDead(e.ctx, outbox.DeadQuery{Stream: stream, AllGroups: true, Limit: 1})
	if err != nil || len(dead) != 1 {
		t.Fatalf("ListDead: %v, %v", dead, err)
	}
	secrets := []string{stream, key, payload, group, c.ClaimKey, "SECRET"}

	values := map[string]any{"Claimed": c, "Receipt": c.Receipt(), "Event": ev, "DeadEvent": dead[0]}
	for name, v := range values {
		var outputs []string
		for _, verb := range []string{"%v", "%+v", "%#v", "%s"} {
			outputs = append(outputs, fmt.Sprintf(verb, v))
		}
		outputs = append(outputs, fmt.Sprint(v), fmt.Sprintf("%v", []any{v}))
		outputs = append(outputs, v.(fmt.Stringer).String())
		for _, h := range []func(*bytes.Buffer) slog.Handler{
			func(b *bytes.Buffer) slog.Handler { return slog.NewJSONHandler(b, nil) },
			func(b *bytes.Buffer) slog.Handler { return slog.NewTextHandler(b, nil) },
		} {
			var buf bytes.Buffer
			slog.New(h(&buf)).Info("event", "value", v, slog.Any("any", v))
			outputs = append(outputs, buf.String())
		}
		for i, out := range outputs {
			if !strings.Contains(out, "REDACTED") && !strings.Contains(out, "redacted") {
				t.Errorf("%s output %d does not say what it redacted: %s", name, i, out)
			}
			for _, s := range secrets {
				if strings.Contains(out, s) {
					t.Errorf("%s output %d leaks %q: %s", name, i, s, out)
				}
			}
		}
		// Pointers redact too.
		var buf bytes.Buffer
		switch v := v.(type) {
		case outbox.Claimed:
			fmt.Fprintf(&buf, "%v %+v %#v", &v, &v, &v)
			slog.New(slog.NewJSONHandler(&buf, nil)).Info("p", "v", &v)
		case outbox.Receipt:
			fmt.Fprintf(&buf, "%v %+v %#v", &v, &v, &v)
			slog.New(slog.NewJSONHandler(&buf, nil)).Info("p", "v", &v)
		case outbox.Event:
			fmt.Fprintf(&buf, "%v %+v %#v", &v, &v, &v)
			slog.New(slog.NewJSONHandler(&buf, nil)).Info("p", "v", &v)
		case outbox.DeadEvent:
			fmt.Fprintf(&buf, "%v %+v %#v", &v, &v, &v)
			slog.New(slog.NewJSONHandler(&buf, nil)).Info("p", "v", &v)
		}
		for _, s := range secrets {
			if strings.Contains(buf.String(), s) {
				t.Errorf("%s pointer output leaks %q: %s", name, s, buf.String())
			}
		}
	}
	// What is not secret is still shown, so the output is useful.
	if s := c.String(); !strings.Contains(s, "Visible.Kind") || !strings.Contains(s, fmt.Sprint(c.ID)) {
		t.Errorf("Claimed.String hides the kind or id: %s", s)
	}
	if s := dead[0].String(); !strings.Contains(s, "visible failure") {
		t.Errorf("DeadEvent.String hides the failure text: %s", s)
	}
}

func testExtend(t *testing.T, e *env) {
	for i := range 3 {
		e.enqueue(event("s", fmt.Sprintf("k%d", i)))
	}
	start := e.clock.Now()
	req := claimReq("s", 3, 10*time.Second, 5)
	cs := e.claim(req)
	if len(cs) != 3 {
		t.Fatalf("claimed %d", len(cs))
	}
	e.clock.Advance(8 * time.Second)
	exp, err := e.s.Extend(e.ctx, cs[0].Receipt(), 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if want := start.Add(38 * time.Second); !exp.Equal(want) {
		t.Fatalf("extended to %v, want %v", exp, want)
	}
	// Batch: two live, one wrong key.
	bad := outbox.Receipt{ID: cs[2].ID, ClaimKey: wrongClaimKey}
	exp, stale, err := e.s.ExtendBatch(e.ctx, []outbox.Receipt{cs[1].Receipt(), bad}, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if want := start.Add(28 * time.Second); !exp.Equal(want) || len(stale) != 1 || stale[0] != bad {
		t.Fatalf("ExtendBatch: expiry %v (want %v), stale %v", exp, want, stale)
	}
	// At start+11s the unextended claim has expired; the extended ones hold.
	e.clock.Advance(3 * time.Second)
	got := e.claim(req)
	if len(got) != 1 || got[0].ID != cs[2].ID {
		t.Fatalf("after the original lease: want only %d reclaimed, got %v", cs[2].ID, got)
	}
	if _, err := e.s.Extend(e.ctx, cs[2].Receipt(), time.Minute); !errors.Is(err, outbox.ErrStaleClaim) {
		t.Fatalf("extend a reclaimed claim: want ErrStaleClaim, got %v", err)
	}
	// At start+30s: cs[0] (to 38s) still holds, cs[1] (to 28s) expired.
	e.clock.Advance(19 * time.Second)
	if err := e.s.Acknowledge(e.ctx, cs[0].Receipt()); err != nil {
		t.Fatalf("acknowledge an extended claim: %v", err)
	}
	if _, err := e.s.Extend(e.ctx, cs[1].Receipt(), time.Minute); !errors.Is(err, outbox.ErrStaleClaim) {
		t.Fatalf("extend an expired claim: want ErrStaleClaim, got %v", err)
	}
	if err := e.s.Acknowledge(e.ctx, cs[1].Receipt()); !errors.Is(err, outbox.ErrStaleClaim) {
		t.Fatalf("acknowledge an expired claim: want ErrStaleClaim, got %v", err)
	}
	e.expectRow(cs[0].ID, outbox.StatusDelivered, 1)
	e.expectRow(cs[1].ID, outbox.StatusProcessing, 1)
	// Extend can also shorten, to now+lease.
	live := e.claimOne(req)
	if live.ID != cs[1].ID || live.Attempts != 2 {
		t.Fatalf("reclaim the expired claim: id %d attempts %d", live.ID, live.Attempts)
	}
	exp, err = e.s.Extend(e.ctx, live.Receipt(), time.Second)
	if err != nil || !exp.Equal(e.clock.Now().Add(time.Second)) {
		t.Fatalf("shorten: %v, %v", exp, err)
	}
}

func testRelease(t *testing.T, e *env) {
	a := e.enqueue(event("s", "a"))
	b := e.enqueue(event("s", "b"))
	req := claimReq("s", 2, time.Minute, 1)
	cs := e.claim(req)
	if len(cs) != 2 {
		t.Fatalf("claimed %d", len(cs))
	}
	n, err := e.s.Release(e.ctx, cs[0].Receipt(), outbox.Receipt{ID: cs[1].ID, ClaimKey: wrongClaimKey})
	if err != nil || n != 1 {
		t.Fatalf("release: want 1, got %d, %v", n, err)
	}
	e.expectRow(a.ID, outbox.StatusPending, 0)
	e.expectRow(b.ID, outbox.StatusProcessing, 1)
	// Released events are due at once and, with MaxAttempts 1, are not
	// dead-lettered: the released attempt did not count.
	again := e.claimOne(req)
	if again.ID != a.ID || again.Attempts != 1 || again.ClaimKey == cs[0].ClaimKey {
		t.Fatalf("reclaim after release: id %d attempts %d", again.ID, again.Attempts)
	}
	if err := e.s.Acknowledge(e.ctx, cs[0].Receipt()); !errors.Is(err, outbox.ErrStaleClaim) {
		t.Fatalf("released claim key: want ErrStaleClaim, got %v", err)
	}
	if n, err := e.s.Release(e.ctx, cs[0].Receipt()); err != nil || n != 0 {
		t.Fatalf("release with a released key: %d, %v", n, err)
	}
	if err := e.s.Acknowledge(e.ctx, again.Receipt()); err != nil {
		t.Fatal(err)
	}
	// A delivered event cannot be released.
	if n, err := e.s.Release(e.ctx, again.Receipt()); err != nil || n != 0 {
		t.Fatalf("release a delivered event: %d, %v", n, err)
	}
	e.expectRow(a.ID, outbox.StatusDelivered, 1)
}

func testPurge(t *testing.T, e *env) {
	req := claimReq("s", 1, time.Minute, 1)
	deliver := func(key string) int64 {
		res := e.enqueue(event("s", key))
		c := e.claimOne(req)
		if err := e.s.Acknowledge(e.ctx, c.Receipt()); err != nil {
			t.Fatal(err)
		}
		return res.ID
	}
	old1 := deliver("old1")
	old2 := deliver("old2")
	e.clock.Advance(time.Hour)
	recent := deliver("recent")
	pending := e.enqueue(event("s", "pending")).ID
	dead := e.enqueue(event("s", "dead")).ID
	c := e.claim(claimReq("s", 10, time.Minute, 1))
	if len(c) != 2 {
		t.Fatalf("claimed %d", len(c))
	}
	for _, cl := range c {
		if cl.ID == pending {
			if _, err := e.s.Release(e.ctx, cl.Receipt()); err != nil {
				t.Fatal(err)
			}
		} else if _, err := e.s.Fail(e.ctx, cl.Receipt(), outbox.Failure{Reason: "x", MaxAttempts: 1}); err != nil {
			t.Fatal(err)
		}
	}
	e.clock.Advance(30 * time.Minute)
	// CountPurgeable counts what Purge would delete, and deletes nothing.
	for horizon, want := range map[time.Duration]int64{2 * time.Hour: 0, time.Hour: 2, 0: 3} {
		if n, err := e.s.CountPurgeable(e.ctx, horizon); err != nil || n != want {
			t.Fatalf("CountPurgeable(%s): %d, %v; want %d", horizon, n, err, want)
		}
	}
	if _, err := e.s.CountPurgeable(e.ctx, -time.Second); !errors.Is(err, outbox.ErrInvalidHorizon) {
		t.Fatalf("CountPurgeable(-1s): %v, want ErrInvalidHorizon", err)
	}
	// Horizon 2h: nothing is that old.
	if n, err := e.s.Purge(e.ctx, 2*time.Hour, 100); err != nil || n != 0 {
		t.Fatalf("purge 2h: %d, %v", n, err)
	}
	// Horizon 1h: the two old ones (delivered 90 min ago), one per call.
	if n, err := e.s.Purge(e.ctx, time.Hour, 1); err != nil || n != 1 {
		t.Fatalf("purge 1h limit 1: %d, %v", n, err)
	}
	if n := e.count("SELECT COUNT(*) FROM millpond_outbox WHERE id = ?", old1); n != 0 {
		t.Fatalf("the oldest delivered row was not purged first")
	}
	if n, err := e.s.Purge(e.ctx, time.Hour, 100); err != nil || n != 1 {
		t.Fatalf("purge 1h: %d, %v", n, err)
	}
	if n := e.count("SELECT COUNT(*) FROM millpond_outbox WHERE id IN (?, ?)", old1, old2); n != 0 {
		t.Fatalf("old delivered rows left: %d", n)
	}
	e.expectRow(recent, outbox.StatusDelivered, 1)
	// Horizon 0: every delivered row, never pending or dead ones.
	if n, err := e.s.Purge(e.ctx, 0, 100); err != nil || n != 1 {
		t.Fatalf("purge 0: %d, %v", n, err)
	}
	e.expectRow(pending, outbox.StatusPending, 0)
	e.expectRow(dead, outbox.StatusDead, 1)
	if n := e.count("SELECT COUNT(*) FROM millpond_outbox"); n != 2 {
		t.Fatalf("want 2 rows left, got %d", n)
	}
	// A purged key may be enqueued again as a new event.
	if res := e.enqueue(event("s", "old1")); !res.Inserted || res.ID == old1 {
		t.Fatalf("re-enqueue a purged key: %+v", res)
	}
}

func testStats(t *testing.T, e *env) {
	if st, err := e.s.Stats(e.ctx); err != nil || len(st) != 0 {
		t.Fatalf("empty stats: %v, %v", st, err)
	}
	start := e.clock.Now()
	for i := range 5 {
		e.enqueue(event("a", fmt.Sprintf("k%d", i)))
		e.clock.Advance(time.Second)
	}
	e.enqueue(event("b", "k"))
	cs := e.claim(claimReq("a", 3, time.Minute, 1))
	if err := e.s.Acknowledge(e.ctx, cs[0].Receipt()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Fail(e.ctx, cs[1].Receipt(), outbox.Failure{Reason: "x", MaxAttempts: 1}); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(10 * time.Second)
	st, err := e.s.Stats(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Stream a: k0 delivered, k1 dead, k2 processing, k3 k4 pending; oldest
	// undelivered is k2, enqueued at start+2s, now is start+15s.
	want := []outbox.StreamStats{
		{Stream: "a", Pending: 2, Processing: 1, Dead: 1, OldestPendingAge: 13 * time.Second},
		{Stream: "b", Pending: 1, OldestPendingAge: 10 * time.Second},
	}
	if len(st) != len(want) {
		t.Fatalf("stats: got %+v", st)
	}
	for i := range want {
		if st[i] != want[i] {
			t.Errorf("stats[%d]: got %+v, want %+v", i, st[i], want[i])
		}
	}
	_ = start
	// A stream with only dead events reports no pending age.
	e.clock.Advance(time.Second)
	for _, c := range e.claim(claimReq("a", 10, time.Minute, 1)) {
		if _, err := e.s.Fail(e.ctx, c.Receipt(), outbox.Failure{Reason: "x", MaxAttempts: 1}); err != nil {
			t.Fatal(err)
		}
	}
	e.clock.Advance(2 * time.Minute) // k2's lease expires; the next claim dead-letters it
	e.expectNothingDue(claimReq("a", 10, time.Minute, 1))
	st, err = e.s.Stats(e.ctx)
	if err != nil || len(st) != 2 {
		t.Fatalf("stats: %+v, %v", st, err)
	}
	if got := st[0]; got != (outbox.StreamStats{Stream: "a", Dead: 4}) {
		t.Fatalf("stream a: %+v", got)
	}
}

func testConsumerGroups(t *testing.T, e *env) {
	for _, g := range []string{"billing", "shipping"} {
		if err := e.s.RegisterGroup(e.ctx, "orders", g); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.s.RegisterGroup(e.ctx, "orders", "billing"); err != nil {
		t.Fatalf("register twice: %v", err)
	}
	res := e.enqueue(event("orders", "o1"))
	if !res.Inserted {
		t.Fatal("not inserted")
	}
	if n := e.count("SELECT COUNT(*) FROM millpond_outbox WHERE stream = 'orders' AND event_key = 'o1'"); n != 2 {
		t.Fatalf("want one row per group (2), got %d", n)
	}
	if n := e.count("SELECT MIN(id) FROM millpond_outbox WHERE event_key = 'o1'"); n != res.ID {
		t.Fatalf("Enqueued.ID %d is not the lowest row id %d", res.ID, n)
	}
	if again := e.enqueue(event("orders", "o1")); again.ID != res.ID || again.Inserted {
		t.Fatalf("idempotent enqueue with groups: %+v", again)
	}
	greq := func(g string) outbox.ClaimRequest {
		return outbox.ClaimRequest{Stream: "orders", Group: g, Worker: "w", Limit: 10, Lease: time.Minute, MaxAttempts: 2}
	}
	// The default group gets nothing once groups exist.
	e.expectNothingDue(greq(""))

	b := e.claim(greq("billing"))
	if len(b) != 1 || b[0].Group != "billing" || b[0].Key != "o1" {
		t.Fatalf("billing claim: %v", b)
	}
	if err := e.s.Acknowledge(e.ctx, b[0].Receipt()); err != nil {
		t.Fatal(err)
	}
	// Shipping's delivery is independent: still due, and fails on its own.
	s := e.claim(greq("shipping"))
	if len(s) != 1 || s[0].Group != "shipping" || s[0].ID == b[0].ID {
		t.Fatalf("shipping claim: %v", s)
	}
	// A receipt of one group cannot settle another group's row.
	if err := e.s.Acknowledge(e.ctx, outbox.Receipt{ID: s[0].ID, ClaimKey: b[0].ClaimKey}); !errors.Is(err, outbox.ErrStaleClaim) {
		t.Fatalf("billing key on shipping row: %v", err)
	}
	if _, err := e.s.Fail(e.ctx, s[0].Receipt(), outbox.Failure{Reason: "x", MaxAttempts: 2}); err != nil {
		t.Fatal(err)
	}
	e.expectRow(b[0].ID, outbox.StatusDelivered, 1)
	e.expectRow(s[0].ID, outbox.StatusPending, 1)
	e.expectNothingDue(greq("billing"))
	s2 := e.claimOne(greq("shipping"))
	if s2.ID != s[0].ID || s2.Attempts != 2 {
		t.Fatalf("shipping retry: %d attempts %d", s2.ID, s2.Attempts)
	}
	if _, err := e.s.Fail(e.ctx, s2.Receipt(), outbox.Failure{Reason: "x", MaxAttempts: 2}); err != nil {
		t.Fatal(err)
	}
	var st []outbox.StreamStats
	dead, err := e.s.ListDead(e.ctx, outbox.DeadQuery{Stream: "orders", Group: "shipping", Limit: 10})
	if err != nil || len(dead) != 1 || dead[0].Group != "shipping" {
		t.Fatalf("ListDead shipping: %v, %v", dead, err)
	}
	if d, err := e.s.ListDead(e.ctx, outbox.DeadQuery{Stream: "orders", Group: "billing", Limit: 10}); err != nil || len(d) != 0 {
		t.Fatalf("ListDead billing: %v, %v", d, err)
	}
	if d, err := e.s.ListDead(e.ctx, outbox.DeadQuery{Stream: "orders", AllGroups: true, Limit: 10}); err != nil || len(d) != 1 {
		t.Fatalf("ListDead all groups: %v, %v", d, err)
	}

	// A stream with no group goes to the default group "".
	plain := e.enqueue(event("plain", "p1"))
	if n := e.count("SELECT COUNT(*) FROM millpond_outbox WHERE stream = 'plain' AND consumer_group = ''"); n != 1 {
		t.Fatalf("default group rows: %d", n)
	}
	pc := e.claim(outbox.ClaimRequest{Stream: "plain", Worker: "w", Limit: 10, Lease: time.Minute, MaxAttempts: 1})
	if len(pc) != 1 || pc[0].ID != plain.ID || pc[0].Group != "" {
		t.Fatalf("default group claim: %v", pc)
	}

	// A group registered later sees only events enqueued after it registered.
	if err := e.s.RegisterGroup(e.ctx, "orders", "audit"); err != nil {
		t.Fatal(err)
	}
	e.enqueue(event("orders", "o2"))
	audit := e.claim(greq("audit"))
	if len(audit) != 1 || audit[0].Key != "o2" {
		t.Fatalf("late group: want only o2, got %v", audit)
	}
	billing := e.claim(greq("billing"))
	if len(billing) != 1 || billing[0].Key != "o2" {
		t.Fatalf("billing after o2: %v", billing)
	}
	if n := e.count("SELECT COUNT(*) FROM millpond_outbox WHERE event_key = 'o2'"); n != 3 {
		t.Fatalf("o2 rows: want 3 groups, got %d", n)
	}

	// Enqueuing an old key again (a publisher retry) after a group registered
	// is still idempotent: the late group does not get the old event, and
	// other content is still a conflict.
	if again := e.enqueue(event("orders", "o1")); again.ID != res.ID || again.Inserted {
		t.Fatalf("re-enqueue of o1 after audit registered: want id %d not inserted, got %+v", res.ID, again)
	}
	if n := e.count("SELECT COUNT(*) FROM millpond_outbox WHERE event_key = 'o1'"); n != 2 {
		t.Fatalf("o1 rows after re-enqueue: want 2, got %d", n)
	}
	otherO1 := event("orders", "o1")
	otherO1.Payload = []byte("changed")
	tx, _, rollback := e.db.Begin(t)
	err = e.enqueueErr(tx, otherO1)
	rollback()
	if !errors.Is(err, outbox.ErrIdempotencyConflict) {
		t.Fatalf("o1 with other content after audit registered: want ErrIdempotencyConflict, got %v", err)
	}
	// The same holds for an event of the default group once a group exists.
	if again := e.enqueue(event("plain", "p1")); again.ID != plain.ID || again.Inserted {
		t.Fatalf("default-group event before any group: %+v", again)
	}
	if err := e.s.RegisterGroup(e.ctx, "plain", "late"); err != nil {
		t.Fatal(err)
	}
	if again := e.enqueue(event("plain", "p1")); again.ID != plain.ID || again.Inserted {
		t.Fatalf("re-enqueue of a default-group event after a group registered: want id %d not inserted, got %+v", plain.ID, again)
	}
	if n := e.count("SELECT COUNT(*) FROM millpond_outbox WHERE stream = 'plain'"); n != 1 {
		t.Fatalf("plain rows: want 1, got %d", n)
	}

	// Unregistering stops new rows for the group; its rows stay.
	if err := e.s.UnregisterGroup(e.ctx, "orders", "audit"); err != nil {
		t.Fatal(err)
	}
	e.enqueue(event("orders", "o3"))
	if n := e.count("SELECT COUNT(*) FROM millpond_outbox WHERE consumer_group = 'audit'"); n != 1 {
		t.Fatalf("audit rows after unregister: %d", n)
	}
	if n := e.count("SELECT COUNT(*) FROM millpond_outbox WHERE event_key = 'o3'"); n != 2 {
		t.Fatalf("o3 rows: %d", n)
	}
	// Stats are per stream and group.
	st, err = e.s.Stats(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	groups := map[string]outbox.StreamStats{}
	for _, x := range st {
		groups[x.Stream+"/"+x.Group] = x
	}
	if g := groups["orders/shipping"]; g.Dead != 1 || g.Pending != 2 {
		t.Fatalf("shipping stats: %+v (all %+v)", g, st)
	}
	if g := groups["orders/audit"]; g.Processing != 1 {
		t.Fatalf("audit stats: %+v", g)
	}
}

func testMigrations(t *testing.T, e *env) {
	// testdb already migrated once.
	if err := e.s.Migrate(e.ctx); err != nil {
		t.Fatalf("second migrate: %v", err)
	}
	migrations, err := outbox.Migrations(e.db.Dialect)
	if err != nil {
		t.Fatal(err)
	}
	if n := e.count("SELECT COUNT(*) FROM millpond_schema_migrations"); n != int64(len(migrations)) {
		t.Fatalf("want %d recorded migrations, got %d", len(migrations), n)
	}
	e.enqueue(event("s", "before-down"))
	if err := e.s.MigrateDown(e.ctx); err != nil {
		t.Fatal(err)
	}
	if n := e.tables(); n != 0 {
		t.Fatalf("MigrateDown left %d millpond tables", n)
	}
	if err := e.s.MigrateDown(e.ctx); err != nil {
		t.Fatalf("MigrateDown twice: %v", err)
	}
	if err := e.s.Migrate(e.ctx); err != nil {
		t.Fatalf("migrate after down: %v", err)
	}
	if n := e.tables(); n != 5 {
		t.Fatalf("want 5 millpond tables (events, deliveries, subscriptions, ordering, migrations), got %d", n)
	}
	if err := e.s.Migrate(e.ctx); err != nil {
		t.Fatalf("migrate again: %v", err)
	}
	if n := e.count("SELECT COUNT(*) FROM millpond_outbox"); n != 0 {
		t.Fatalf("data survived MigrateDown: %d rows", n)
	}
	res := e.enqueue(event("s", "after"))
	c := e.claimOne(claimReq("s", 1, time.Minute, 1))
	if c.ID != res.ID {
		t.Fatal("claimed the wrong event")
	}
	if err := e.s.Acknowledge(e.ctx, c.Receipt()); err != nil {
		t.Fatal(err)
	}
	// Concurrent migrations are serialised by the migration lock.
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() { errs <- e.s.Migrate(e.ctx) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("concurrent migrate: %v", err)
		}
	}
	ms, err := outbox.Migrations(e.db.Dialect)
	if err != nil || len(ms) == 0 || ms[0].Up == "" || ms[0].Down == "" {
		t.Fatalf("Migrations(%s): %v, %v", e.db.Dialect, ms, err)
	}
}

// tables counts the millpond tables in the test's schema or database (not
// the millpond_outbox view).
func (e *env) tables() int64 {
	e.t.Helper()
	switch e.db.Dialect {
	case "postgres":
		return e.count("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' AND table_name LIKE 'millpond%'")
	case "mysql":
		return e.count("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_type = 'BASE TABLE' AND table_name LIKE 'millpond%'")
	default:
		return e.count("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name LIKE 'millpond%'")
	}
}

func testRoundTrip(t *testing.T, e *env) {
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	md := map[string]string{
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"unicode":     "héllo wörld ✓ 😀",
		"quotes":      `"'\` + "\n\t\x00",
		"empty":       "",
		"name":        "Thing.Happened",
	}
	events := []outbox.Event{
		{Stream: "rt", Key: "binary", Kind: "Bin", Payload: all, Metadata: md},
		{Stream: "rt", Key: "nil-payload", Kind: "Nil"},
		{Stream: "rt", Key: "big", Kind: "Big", Payload: bytes.Repeat(all, outbox.MaxPayloadBytes/256)},
		{Stream: "rt", Key: "json", Kind: "Json", Payload: []byte(`{"a":[1,2,{"b":null}]}`), Metadata: map[string]string{"k": strings.Repeat("v", 1000)}},
	}
	for _, ev := range events {
		e.enqueue(ev)
	}
	got := e.claim(claimReq("rt", 10, time.Minute, 1))
	if len(got) != len(events) {
		t.Fatalf("claimed %d", len(got))
	}
	for i, c := range got {
		want := events[i]
		if c.Key != want.Key || c.Kind != want.Kind || c.Stream != want.Stream {
			t.Errorf("%s: identity %q %q %q", want.Key, c.Stream, c.Key, c.Kind)
		}
		if !bytes.Equal(c.Payload, want.Payload) {
			t.Errorf("%s: payload differs (%d bytes, want %d)", want.Key, len(c.Payload), len(want.Payload))
		}
		wantMD := want.Metadata
		if wantMD == nil {
			wantMD = map[string]string{}
		}
		if c.Metadata == nil || !maps.Equal(c.Metadata, wantMD) {
			t.Errorf("%s: metadata %v, want %v", want.Key, c.Metadata, wantMD)
		}
		if !c.CreatedAt.Equal(e.clock.Now()) {
			t.Errorf("%s: created at %v", want.Key, c.CreatedAt)
		}
	}
	// The binary payload is also its idempotency identity.
	flipped := bytes.Clone(all)
	flipped[255] = 0
	tx, _, rollback := e.db.Begin(t)
	defer rollback()
	if err := e.enqueueErr(tx, outbox.Event{Stream: "rt", Key: "binary", Kind: "Bin", Payload: flipped}); !errors.Is(err, outbox.ErrIdempotencyConflict) {
		t.Fatalf("one byte differs: want ErrIdempotencyConflict, got %v", err)
	}
	// Kind and payload are hashed apart: ("ab", "c") is not ("a", "bc").
	if _, err := e.s.Enqueue(e.ctx, tx, outbox.Event{Stream: "rt", Key: "split", Kind: "ab", Payload: []byte("c")}); err != nil {
		t.Fatal(err)
	}
	if err := e.enqueueErr(tx, outbox.Event{Stream: "rt", Key: "split", Kind: "a", Payload: []byte("bc")}); !errors.Is(err, outbox.ErrIdempotencyConflict) {
		t.Fatalf("shifted kind/payload boundary: want ErrIdempotencyConflict, got %v", err)
	}
}

func testClaimOrderAndBatchAck(t *testing.T, e *env) {
	var ids []int64
	for i := range 5 {
		ids = append(ids, e.enqueue(event("s", fmt.Sprintf("k%d", i))).ID)
	}
	e.enqueue(event("other", "k0"))
	req := claimReq("s", 3, time.Minute, 3)
	cs := e.claim(req)
	if len(cs) != 3 {
		t.Fatalf("claimed %d", len(cs))
	}
	for i, c := range cs {
		if c.ID != ids[i] || c.Stream != "s" || c.Attempts != 1 {
			t.Fatalf("claim %d: id %d, want %d (oldest first)", i, c.ID, ids[i])
		}
		if !c.LeaseExpiresAt.Equal(e.clock.Now().Add(time.Minute)) {
			t.Fatalf("claim %d: lease expires at %v", i, c.LeaseExpiresAt)
		}
	}
	keys := map[string]bool{}
	for _, c := range cs {
		keys[c.ClaimKey] = true
	}
	if len(keys) != 3 {
		t.Fatal("claim keys are not distinct")
	}
	rest := e.claim(outbox.ClaimRequest{Stream: "s", Worker: "w2", Limit: 10, Lease: time.Minute, MaxAttempts: 3})
	if len(rest) != 2 || rest[0].ID != ids[3] || rest[1].ID != ids[4] {
		t.Fatalf("second claimer: %v", rest)
	}
	if n := e.count("SELECT COUNT(*) FROM millpond_outbox WHERE claimed_by = 'w2'"); n != 2 {
		t.Fatalf("claimed_by w2: %d", n)
	}
	bad := outbox.Receipt{ID: cs[1].ID, ClaimKey: wrongClaimKey}
	stale, err := e.s.AcknowledgeBatch(e.ctx, []outbox.Receipt{cs[0].Receipt(), bad, cs[2].Receipt(), rest[0].Receipt()})
	if err != nil {
		t.Fatal(err)
	}
	if len(stale) != 1 || stale[0] != bad {
		t.Fatalf("stale: %v", stale)
	}
	e.expectRow(cs[0].ID, outbox.StatusDelivered, 1)
	e.expectRow(cs[1].ID, outbox.StatusProcessing, 1)
	e.expectRow(cs[2].ID, outbox.StatusDelivered, 1)
	if r := e.row(cs[0].ID); !r.DeliveredAt.Valid || r.DeliveredAt.Int64 != e.clock.Now().UnixMicro() {
		t.Fatalf("delivered_at %+v", r.DeliveredAt)
	}
	// Acknowledging the same batch again: all stale, nothing changes.
	stale, err = e.s.AcknowledgeBatch(e.ctx, []outbox.Receipt{cs[0].Receipt(), cs[2].Receipt()})
	if err != nil || len(stale) != 2 {
		t.Fatalf("second ack: stale %v, %v", stale, err)
	}
	// A batch holding the same receipt twice settles it once.
	stale, err = e.s.AcknowledgeBatch(e.ctx, []outbox.Receipt{cs[1].Receipt(), cs[1].Receipt()})
	if err != nil || len(stale) != 0 {
		t.Fatalf("duplicate receipt in a batch: stale %v, %v", stale, err)
	}
	e.expectRow(cs[1].ID, outbox.StatusDelivered, 1)
	if n := e.count("SELECT COUNT(*) FROM millpond_outbox WHERE stream = 'other' AND status = 'pending'"); n != 1 {
		t.Fatal("claims on one stream touched another")
	}
}

// testClaimLowerBound: a claim with After takes only events with larger
// ids, oldest first, due ones included whatever their state (pending, an
// expired lease); the events below it stay for a claim without it. A
// negative bound is refused; AcknowledgeAndClaimNext ignores the bound.
func testClaimLowerBound(t *testing.T, e *env) {
	var ids []int64
	for i := range 6 {
		ids = append(ids, e.enqueue(event("s", fmt.Sprintf("k%d", i))).ID)
	}
	req := claimReq("s", 2, time.Minute, 3)
	req.After = ids[1]
	got := e.claim(req)
	if len(got) != 2 || got[0].ID != ids[2] || got[1].ID != ids[3] {
		t.Fatalf("claim after %d: %v", ids[1], got)
	}
	// An expired lease above the bound is taken again; the pending events
	// below it are not.
	e.clock.Advance(time.Minute)
	req.Limit = 10
	got = e.claim(req)
	if len(got) != 4 || got[0].ID != ids[2] || !got[0].Reclaimed || got[3].ID != ids[5] {
		t.Fatalf("claim after %d with expired leases: %v", ids[1], got)
	}
	req.After = ids[5]
	e.expectNothingDue(req)
	req.After = 0
	got = e.claim(req)
	if len(got) != 2 || got[0].ID != ids[0] || got[1].ID != ids[1] {
		t.Fatalf("claim without a bound: %v", got)
	}
	req.After = -1
	if _, err := e.s.Claim(e.ctx, req); !errors.Is(err, outbox.ErrInvalidID) {
		t.Fatalf("negative bound: %v", err)
	}
	if err := req.Validate(); !errors.Is(err, outbox.ErrInvalidID) {
		t.Fatalf("negative bound, Validate: %v", err)
	}
	// Handing over ignores the bound: the next event of the key is below it.
	first := event("o", "o1")
	first.OrderingKey = "order-1"
	second := event("o", "o2")
	second.OrderingKey = "order-1"
	e.enqueue(first)
	next := e.enqueue(second)
	oreq := claimReq("o", 10, time.Minute, 3)
	head := e.claimOne(oreq)
	oreq.After = next.ID + 1000
	handed, stale, err := e.s.AcknowledgeAndClaimNext(e.ctx, []outbox.Receipt{head.Receipt()}, oreq)
	if err != nil || len(stale) != 0 || len(handed) != 1 || handed[0].ID != next.ID {
		t.Fatalf("hand over under a bound: %v, stale %v, %v", handed, stale, err)
	}
}

func testDelays(t *testing.T, e *env) {
	ev := event("s", "later")
	ev.Delay = time.Minute
	res := e.enqueue(ev)
	req := claimReq("s", 10, time.Minute, 5)
	e.expectNothingDue(req)
	e.clock.Advance(time.Minute - time.Microsecond)
	e.expectNothingDue(req)
	e.clock.Advance(time.Microsecond)
	c := e.claimOne(req)
	if c.ID != res.ID {
		t.Fatal("wrong event")
	}
	if _, err := e.s.Fail(e.ctx, c.Receipt(), outbox.Failure{Reason: "retry later", MaxAttempts: 5, RetryDelay: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(29 * time.Second)
	e.expectNothingDue(req)
	e.clock.Advance(time.Second)
	c = e.claimOne(req)
	if c.Attempts != 2 {
		t.Fatalf("attempts %d", c.Attempts)
	}
	if got := e.row(c.ID).LastError; got != "retry later" {
		t.Fatalf("last error %q", got)
	}
}

func testDatabaseClock(t *testing.T, e *env) {
	res := e.enqueue(event("s", "now"))
	before := time.Now()
	c := e.claimOne(claimReq("s", 1, time.Minute, 3))
	after := time.Now()
	// The database runs on this host; allow generous skew anyway.
	lo, hi := before.Add(time.Minute-5*time.Second), after.Add(time.Minute+5*time.Second)
	if c.LeaseExpiresAt.Before(lo) || c.LeaseExpiresAt.After(hi) {
		t.Fatalf("lease expires at %v, want within [%v, %v]", c.LeaseExpiresAt, lo, hi)
	}
	if c.CreatedAt.Before(before.Add(-5*time.Second)) || c.CreatedAt.After(hi) {
		t.Fatalf("created at %v", c.CreatedAt)
	}
	exp, err := e.s.Extend(e.ctx, c.Receipt(), 2*time.Minute)
	if err != nil || !exp.After(c.LeaseExpiresAt) {
		t.Fatalf("extend: %v, %v", exp, err)
	}
	e.expectNothingDue(claimReq("s", 1, time.Minute, 3))
	if err := e.s.Acknowledge(e.ctx, c.Receipt()); err != nil {
		t.Fatal(err)
	}
	if err := e.s.Acknowledge(e.ctx, c.Receipt()); !errors.Is(err, outbox.ErrStaleClaim) {
		t.Fatalf("second ack: %v", err)
	}
	e.expectRow(res.ID, outbox.StatusDelivered, 1)
	st, err := e.s.Stats(e.ctx)
	if err != nil || len(st) != 0 {
		t.Fatalf("stats: %v, %v", st, err)
	}
	// SQLite's clock has millisecond resolution: let it move past the ack.
	time.Sleep(5 * time.Millisecond)
	if n, err := e.s.Purge(e.ctx, 0, 10); err != nil || n != 1 {
		t.Fatalf("purge: %d, %v", n, err)
	}
}

func testConsumerGroupsByKind(t *testing.T, e *env) {
	if err := e.s.RegisterGroup(e.ctx, "orders", "billing", "Order.Placed", "Order.Paid"); err != nil {
		t.Fatal(err)
	}
	if err := e.s.RegisterGroup(e.ctx, "orders", "audit"); err != nil {
		t.Fatal(err)
	}
	if err := e.s.RegisterGroup(e.ctx, "orders", "billing", "Order Placed"); !errors.Is(err, outbox.ErrInvalidKey) {
		t.Fatalf("register with a bad kind: want ErrInvalidKey, got %v", err)
	}
	placed := outbox.Event{Stream: "orders", Key: "o1", Kind: "Order.Placed", Payload: []byte("1")}
	shipped := outbox.Event{Stream: "orders", Key: "o2", Kind: "Order.Shipped", Payload: []byte("2")}
	e.enqueue(placed)
	e.enqueue(shipped)
	groupsOf := func(key string) string {
		t.Helper()
		var gs []string
		for _, g := range []string{"", "audit", "billing"} {
			if e.count("SELECT COUNT(*) FROM millpond_outbox WHERE event_key = ? AND consumer_group = ?", key, g) == 1 {
				gs = append(gs, cmp.Or(g, "default"))
			}
		}
		return strings.Join(gs, ",")
	}
	if got := groupsOf("o1"); got != "audit,billing" {
		t.Fatalf("Order.Placed went to groups %q, want audit,billing", got)
	}
	if got := groupsOf("o2"); got != "audit" {
		t.Fatalf("Order.Shipped went to groups %q, want audit", got)
	}
	// With no group for a kind at all, the event goes to the default group.
	if err := e.s.UnregisterGroup(e.ctx, "orders", "audit"); err != nil {
		t.Fatal(err)
	}
	e.enqueue(outbox.Event{Stream: "orders", Key: "o3", Kind: "Order.Shipped", Payload: []byte("3")})
	if got := groupsOf("o3"); got != "default" {
		t.Fatalf("an event no group subscribes to went to %q, want the default group only", got)
	}
	if n := e.count("SELECT COUNT(*) FROM millpond_outbox WHERE event_key = 'o3'"); n != 1 {
		t.Fatalf("o3 rows: %d", n)
	}
	e.enqueue(outbox.Event{Stream: "orders", Key: "o4", Kind: "Order.Paid", Payload: []byte("4")})
	if got := groupsOf("o4"); got != "billing" {
		t.Fatalf("Order.Paid went to %q, want billing", got)
	}
}

// testGroupOfEveryKindAndKind: a group subscribed to every kind of a stream
// and also to one kind gets one row for an event of that kind, enqueued in
// one statement (a second row would break the enqueue on the unique
// (event_id, consumer_group)); the default group gets none.
func testGroupOfEveryKindAndKind(t *testing.T, e *env) {
	if err := e.s.RegisterGroup(e.ctx, "orders", "billing"); err != nil {
		t.Fatal(err)
	}
	if err := e.s.RegisterGroup(e.ctx, "orders", "billing", "Order.Placed"); err != nil {
		t.Fatal(err)
	}
	if err := e.s.RegisterGroup(e.ctx, "orders", "audit", "Order.Placed"); err != nil {
		t.Fatal(err)
	}
	first := e.enqueue(outbox.Event{Stream: "orders", Key: "o1", Kind: "Order.Placed", Payload: []byte("1")})
	e.enqueue(outbox.Event{Stream: "orders", Key: "o2", Kind: "Order.Shipped", Payload: []byte("2")})
	rows := func(key string) string {
		t.Helper()
		var gs []string
		for _, g := range []string{"", "audit", "billing"} {
			if n := e.count("SELECT COUNT(*) FROM millpond_outbox WHERE event_key = ? AND consumer_group = ?", key, g); n > 0 {
				gs = append(gs, fmt.Sprintf("%s×%d", cmp.Or(g, "default"), n))
			}
		}
		return strings.Join(gs, ",")
	}
	if got := rows("o1"); got != "audit×1,billing×1" {
		t.Fatalf("Order.Placed rows %q, want audit×1,billing×1", got)
	}
	if got := rows("o2"); got != "billing×1" {
		t.Fatalf("Order.Shipped rows %q, want billing×1", got)
	}
	// The enqueue reports the event's first row, and again when repeated.
	if again := e.enqueue(outbox.Event{Stream: "orders", Key: "o1", Kind: "Order.Placed", Payload: []byte("1")}); again.Inserted || again.ID != first.ID {
		t.Fatalf("repeated enqueue: %+v; first %+v", again, first)
	}
	if n := e.count("SELECT COUNT(*) FROM millpond_outbox WHERE consumer_group = ?", ""); n != 0 {
		t.Fatalf("default group rows: %d", n)
	}
}

// expectRefused presents r to every call that settles or moves a claim and
// asserts that each refuses it as stale and that the row is unchanged.
func (e *env) expectRefused(label string, r outbox.Receipt) {
	t := e.t
	t.Helper()
	before := e.row(r.ID)
	if err := e.s.Acknowledge(e.ctx, r); !errors.Is(err, outbox.ErrStaleClaim) {
		t.Errorf("%s: Acknowledge: want ErrStaleClaim, got %v", label, err)
	}
	if st, err := e.s.AcknowledgeBatch(e.ctx, []outbox.Receipt{r}); err != nil || len(st) != 1 || st[0] != r {
		t.Errorf("%s: AcknowledgeBatch: want the receipt back as stale, got %v, %v", label, st, err)
	}
	if _, err := e.s.Fail(e.ctx, r, outbox.Failure{Reason: "boom", MaxAttempts: 5, RetryDelay: time.Second}); !errors.Is(err, outbox.ErrStaleClaim) {
		t.Errorf("%s: Fail: want ErrStaleClaim, got %v", label, err)
	}
	if _, err := e.s.Extend(e.ctx, r, time.Minute); !errors.Is(err, outbox.ErrStaleClaim) {
		t.Errorf("%s: Extend: want ErrStaleClaim, got %v", label, err)
	}
	if _, st, err := e.s.ExtendBatch(e.ctx, []outbox.Receipt{r}, time.Minute); err != nil || len(st) != 1 {
		t.Errorf("%s: ExtendBatch: want one stale receipt, got %v, %v", label, st, err)
	}
	if n, err := e.s.Release(e.ctx, r); err != nil || n != 0 {
		t.Errorf("%s: Release: want 0 released, got %d, %v", label, n, err)
	}
	if after := e.row(r.ID); after != before {
		t.Errorf("%s: row changed:\nbefore %+v\nafter  %+v", label, before, after)
	}
}
