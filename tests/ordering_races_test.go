package tests

import (
	"context"
	"database/sql"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// Races between a key's settlers and its producers or other settlers: in
// each, a transaction holds a row long enough for the other side to commit
// or to wait, so the interleaving the test names is the one that runs.

// readInTx runs a plain read in a raw transaction: the first read of a
// REPEATABLE READ transaction fixes its snapshot.
func readInTx(t *testing.T, raw any, query string) {
	t.Helper()
	var n int64
	var err error
	switch tx := raw.(type) {
	case pgx.Tx:
		err = tx.QueryRow(context.Background(), query).Scan(&n)
	case *sql.Tx:
		err = tx.QueryRowContext(context.Background(), query).Scan(&n)
	}
	if err != nil {
		t.Fatalf("read in transaction: %v", err)
	}
}

// waitForLockWaiters waits until n statements of the test's database have
// waited for a lock (on MySQL: run for over 100 ms, which these tests'
// statements only do waiting for a row another transaction holds).
func waitForLockWaiters(t *testing.T, e *env, n int64) {
	t.Helper()
	query := "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
	if e.db.Dialect == "mysql" {
		query = `SELECT COUNT(*) FROM information_schema.PROCESSLIST
WHERE DB = DATABASE() AND ID <> CONNECTION_ID() AND COMMAND = 'Query' AND TIME_MS > 100`
	}
	deadline := time.Now().Add(10 * time.Second)
	for e.count(query) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d statements never waited for a lock", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestAckInTxSeesAProducerThatCommittedAfterItsFirstRead: a handler
// acknowledges its ordered event in its own transaction (AcknowledgeInTx)
// after reading its data there, and a producer of the same key commits in
// between. The key's next event must be claimable once the handler
// commits. On MySQL the handler's transaction is REPEATABLE READ by
// default, whose plain reads keep the snapshot of its first read: the
// promotion read the key's next event from before the producer and missed
// it, leaving it blocked for good.
func TestAckInTxSeesAProducerThatCommittedAfterItsFirstRead(t *testing.T) {
	for _, dialect := range []string{"postgres", "mysql"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, dialect, true)
			e.enqueue(ordered("s", "a1", "a"))
			req := claimReq("s", 100, time.Minute, 3)
			got := e.expectClaimed(req, "a1")

			raw, commit, rollback := e.db.BeginRaw(t)
			defer rollback()
			readInTx(t, raw, "SELECT COUNT(*) FROM millpond_events") // the handler reads its data
			e.enqueue(ordered("s", "a2", "a"))                       // a producer of key a commits
			if err := e.s.AcknowledgeInTx(e.ctx, testdb.Wrap(raw), got["a1"].Receipt()); err != nil {
				t.Fatalf("acknowledge in transaction: %v", err)
			}
			if err := commit(); err != nil {
				t.Fatalf("commit: %v", err)
			}
			e.expectClaimed(req, "a2")
		})
	}
}

// TestConcurrentReroutesReleaseTheKeyOnce: two Reroutes of the same dead
// default-group head that holds its key (two operators, a double submit, a
// retried command) must move it and release its key once. Both used to
// copy, delete and release: two events of the key were then claimable at
// once (PostgreSQL), or the key counted one too few and its last event
// stayed blocked (MySQL).
func TestConcurrentReroutesReleaseTheKeyOnce(t *testing.T) {
	for _, dialect := range []string{"postgres", "mysql"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, dialect, true)
			for _, k := range []string{"a1", "a2", "a3", "a4"} {
				e.enqueue(ordered("s", k, "a")) // no group yet: the default group
			}
			req := claimReq("s", 100, time.Minute, 1)
			got := e.expectClaimed(req, "a1")
			if out, err := e.s.Fail(e.ctx, got["a1"].Receipt(), outbox.Failure{Reason: "unrouted", MaxAttempts: 1}); err != nil || !out.DeadLettered {
				t.Fatalf("fail a1: %+v, %v", out, err)
			}
			if err := e.s.RegisterGroup(e.ctx, "s", "g"); err != nil {
				t.Fatal(err)
			}
			// Hold the key row: the first Reroute waits for it with the dead
			// row in hand, the second comes while it waits.
			lock, _, unlock := e.db.BeginRaw(t)
			t.Cleanup(unlock)
			readInTx(t, lock, "SELECT unsettled FROM millpond_ordering WHERE stream = 's' AND consumer_group = '' AND ordering_key = 'a' FOR UPDATE")

			var wg sync.WaitGroup
			moved, errs := make([]int, 2), make([]error, 2)
			for i := range 2 {
				wg.Go(func() { moved[i], errs[i] = e.s.Reroute(context.Background(), "s", got["a1"].ID) })
				waitForLockWaiters(t, e, int64(i+1))
			}
			unlock()
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Fatalf("reroute %d: %v", i, err)
				}
			}
			if moved[0]+moved[1] != 1 {
				t.Errorf("the reroutes moved %d and %d events, want 1 in all", moved[0], moved[1])
			}
			if _, unsettled := e.keyState("s", "", "a"); unsettled != 3 {
				t.Errorf("key a counts %d unsettled, want 3 (a2, a3, a4)", unsettled)
			}
			for _, k := range []string{"a2", "a3", "a4"} {
				got := e.expectClaimed(req, k) // one at a time, in order
				e.ack(got[k])
			}
			e.expectNothingDue(req)
		})
	}
}

// TestRerouteSeesAProducerThatCommittedWhileItWaited: Reroute releases a
// dead default-group head that holds its key while a producer of the key
// (an event of a kind no group takes, so in the default group too) is
// committing. The producer's event must be promoted, as every settler
// does. On MySQL Reroute ran in REPEATABLE READ, whose promotion read a
// snapshot from before the producer committed.
func TestRerouteSeesAProducerThatCommittedWhileItWaited(t *testing.T) {
	for _, dialect := range []string{"postgres", "mysql"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, dialect, true)
			e.enqueue(ordered("s", "a1", "a"))
			req := claimReq("s", 100, time.Minute, 1)
			got := e.expectClaimed(req, "a1")
			if out, err := e.s.Fail(e.ctx, got["a1"].Receipt(), outbox.Failure{Reason: "unrouted", MaxAttempts: 1}); err != nil || !out.DeadLettered {
				t.Fatalf("fail a1: %+v, %v", out, err)
			}
			if err := e.s.RegisterGroup(e.ctx, "s", "g", "Thing.Happened"); err != nil {
				t.Fatal(err)
			}
			tx, commit, rollback := e.db.Begin(t)
			t.Cleanup(rollback)
			other := ordered("s", "a2", "a")
			other.Kind = "Other.Happened"
			if _, err := e.s.Enqueue(e.ctx, tx, other); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				_, err := e.s.Reroute(context.Background(), "s", got["a1"].ID)
				done <- err
			}()
			waitForLockWaiters(t, e, 1) // Reroute waits for the producer's key row
			if err := commit(); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatalf("reroute: %v", err)
			}
			e.expectClaimed(req, "a2")
		})
	}
}

// TestRetireDiscardTakesAProducerThatCommittedMeanwhile: RetireGroup with
// Discard while a producer that read the registration before it went is
// committing an ordered event of the group behind a head the discard
// deletes. The event arrived blocked, and the states of the group's keys
// were then deleted under it: nothing would ever promote it, and once the
// group was registered again the key's later events went before it. The
// discard now takes it too, and a later event of the key is a head.
func TestRetireDiscardTakesAProducerThatCommittedMeanwhile(t *testing.T) {
	for _, dialect := range []string{"postgres", "mysql"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, dialect, true)
			if err := e.s.RegisterGroup(e.ctx, "s", "g"); err != nil {
				t.Fatal(err)
			}
			e.enqueue(ordered("s", "a1", "a"))
			tx, commit, rollback := e.db.Begin(t)
			t.Cleanup(rollback)
			if _, err := e.s.Enqueue(e.ctx, tx, ordered("s", "a2", "a")); err != nil {
				t.Fatal(err)
			}
			type result struct {
				r   outbox.Retired
				err error
			}
			done := make(chan result, 1)
			go func() {
				r, err := e.s.RetireGroup(context.Background(), outbox.RetireRequest{Stream: "s", Group: "g", Discard: true})
				done <- result{r, err}
			}()
			waitForLockWaiters(t, e, 1) // the retirement waits for the producer
			if err := commit(); err != nil {
				t.Fatal(err)
			}
			res := <-done
			if res.err != nil {
				t.Fatalf("retire: %v", res.err)
			}
			if left := e.count("SELECT COUNT(*) FROM millpond_deliveries WHERE consumer_group = 'g' AND status <> 'delivered'"); left != 0 {
				t.Errorf("%d undelivered rows of the retired group left, want 0", left)
			}
			if res.r.Pending != 2 || e.count("SELECT COUNT(*) FROM millpond_ordering WHERE consumer_group = 'g'") != 0 {
				t.Errorf("retired %+v with %d key states left, want 2 pending discarded and none", res.r,
					e.count("SELECT COUNT(*) FROM millpond_ordering WHERE consumer_group = 'g'"))
			}
			if err := e.s.RegisterGroup(e.ctx, "s", "g"); err != nil {
				t.Fatal(err)
			}
			e.enqueue(ordered("s", "a3", "a"))
			req := claimReq("s", 100, time.Minute, 3)
			req.Group = "g"
			e.expectClaimed(req, "a3")
		})
	}
}
