package tests

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// TestMySQLEnqueueKnownLocksNoGap checks that enqueuing a known event on
// MySQL/MariaDB leaves concurrent producers free to insert. Resolving a
// known event used to read its delivery rows with a locking read, which in
// REPEATABLE READ share-locks the gap after them in the (event_id,
// consumer_group) index: for the newest event, the gap where every new
// delivery row goes. A producer that then tried to insert waited on that
// gap while holding its key row (an ordering key) or the table's AUTO-INC
// lock (INSERT ... SELECT), and the first transaction's next enqueue of
// that key, or any insert, deadlocked with it (error 1213 or 1467).
//
// Transaction 1 enqueues an event and enqueues it again (a known event);
// transaction 2 then enqueues another event, and transaction 1 a third,
// with transaction 2's ordering key. Transaction 2 must not wait for
// transaction 1; transaction 1 waits for transaction 2's key row until it
// commits; neither may deadlock.
func TestMySQLEnqueueKnownLocksNoGap(t *testing.T) {
	for _, tc := range []struct {
		name             string
		first, other     string // ordering keys of transaction 1's event, and of the next two
		wantSecondBlocks bool   // transaction 1's second event waits for transaction 2
	}{
		{"OrderingKeys", "k1", "k2", true},
		{"NoOrderingKeys", "", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := testdb.New(t, "mysql")
			s := db.Store(t, outbox.WithoutListen())
			ctx := context.Background()
			for _, g := range []string{"a", "b"} {
				if err := s.RegisterGroup(ctx, "s", g); err != nil {
					t.Fatal(err)
				}
			}
			ev := func(key, okey string) outbox.Event {
				return outbox.Event{Stream: "s", Key: key, Kind: "K", Payload: []byte(`{}`), OrderingKey: okey}
			}
			enqueue := func(tx *sql.Tx, e outbox.Event) <-chan error {
				done := make(chan error, 1)
				go func() {
					_, err := s.Enqueue(ctx, outbox.SQLTx(tx), e)
					done <- err
				}()
				return done
			}
			begin := func() *sql.Tx {
				tx, err := db.SQL.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = tx.Rollback() })
				return tx
			}
			tx1, tx2 := begin(), begin()
			if err := <-enqueue(tx1, ev("e1", tc.first)); err != nil {
				t.Fatal(err)
			}
			if res, err := s.Enqueue(ctx, outbox.SQLTx(tx1), ev("e1", tc.first)); err != nil || res.Inserted || res.ID == 0 {
				t.Fatalf("known event: %+v, %v", res, err)
			}
			second := enqueue(tx2, ev("e2", tc.other))
			select {
			case err := <-second:
				if err != nil {
					t.Fatalf("transaction 2's enqueue: %v", err)
				}
			case <-time.After(time.Second):
				// Still waiting on transaction 1's locks: have transaction 1
				// take transaction 2's, which used to deadlock.
				third := enqueue(tx1, ev("e3", tc.other))
				err2 := <-second
				err3 := <-third
				t.Fatalf("transaction 2's enqueue waited for transaction 1, which holds the known event's locks; then transaction 2: %v, transaction 1: %v", err2, err3)
			}
			third := enqueue(tx1, ev("e3", tc.other))
			if tc.wantSecondBlocks {
				select {
				case err := <-third:
					t.Fatalf("transaction 1 enqueued with transaction 2's ordering key while transaction 2 holds it: %v", err)
				case <-time.After(300 * time.Millisecond):
				}
			}
			if err := tx2.Commit(); err != nil {
				t.Fatal(err)
			}
			if err := <-third; err != nil {
				t.Fatalf("transaction 1's enqueue after transaction 2 committed: %v", err)
			}
			if err := tx1.Commit(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestMySQLEnqueueKnownAfterSnapshot checks the other side of the plain
// read that resolves a known event on MySQL: an event committed by a
// concurrent enqueue after the transaction's snapshot was taken is not in
// that snapshot, and the locking read must still find it and its id.
func TestMySQLEnqueueKnownAfterSnapshot(t *testing.T) {
	db := testdb.New(t, "mysql")
	s := db.Store(t, outbox.WithoutListen())
	ctx := context.Background()
	for _, okey := range []string{"", "k"} {
		key := "e" + okey
		e := outbox.Event{Stream: "s", Key: key, Kind: "K", Payload: []byte(`{}`), OrderingKey: okey}
		tx1, err := db.SQL.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx1.Rollback() }()
		var n int
		// A plain read takes the transaction's snapshot before the event exists.
		if err := tx1.QueryRowContext(ctx, "SELECT COUNT(*) FROM millpond_events").Scan(&n); err != nil {
			t.Fatal(err)
		}
		tx2, err := db.SQL.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		first, err := s.Enqueue(ctx, outbox.SQLTx(tx2), e)
		if err != nil || !first.Inserted {
			t.Fatalf("%s: %+v, %v", key, first, err)
		}
		done := make(chan struct{})
		var again outbox.Enqueued
		go func() {
			defer close(done)
			again, err = s.Enqueue(ctx, outbox.SQLTx(tx1), e) // waits for transaction 2
		}()
		time.Sleep(200 * time.Millisecond)
		if err := tx2.Commit(); err != nil {
			t.Fatal(err)
		}
		<-done
		if err != nil || again.Inserted || again.ID != first.ID {
			t.Fatalf("%s enqueued again after a concurrent commit: %+v, %v; want the committed event %d", key, again, err, first.ID)
		}
		if err := tx1.Commit(); err != nil {
			t.Fatal(err)
		}
	}
}
