package tests

import (
	"database/sql"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/millpond/millpond/outbox"
)

// testLockOrder checks that every store call that locks several outbox rows
// (Acknowledge, Extend, Release, Requeue, Purge) locks them in id order,
// whatever order its receipts or ids come in and wherever the rows lie in
// the table: another transaction holds the row with the highest id, the
// call is started with its rows in a random order, and while it waits for
// that row every other row must already be locked by it. Locking in any
// other order is what let the acknowledger and the lease extender of one
// Subscriber deadlock.
//
// SQLite has no row locks (one writer holds the database), so there is no
// order to check.
func testLockOrder(t *testing.T, e *env) {
	if e.db.Dialect == "sqlite" {
		t.Skip("SQLite serialises writers on the whole database; there are no row locks to order")
	}
	const n = 40
	const lease = time.Minute
	type prepared struct {
		ids  []int64             // every row the call locks
		call func() (int, error) // the call; returns how many rows it changed
	}
	receipts := func(stream string) []outbox.Receipt {
		for i := range n {
			e.enqueue(event(stream, "k"+strconv.Itoa(i)))
		}
		cs := e.claim(claimReq(stream, n, lease, 5))
		if len(cs) != n {
			t.Fatalf("%s: claimed %d of %d", stream, len(cs), n)
		}
		rs := make([]outbox.Receipt, n)
		for i, c := range cs {
			rs[i] = c.Receipt()
		}
		rand.Shuffle(len(rs), func(i, j int) { rs[i], rs[j] = rs[j], rs[i] })
		return rs
	}
	ids := func(rs []outbox.Receipt) []int64 {
		out := make([]int64, len(rs))
		for i, r := range rs {
			out[i] = r.ID
		}
		return out
	}
	cases := []struct {
		name    string
		prepare func(stream string) prepared
	}{
		{"Acknowledge", func(stream string) prepared {
			rs := receipts(stream)
			return prepared{ids(rs), func() (int, error) {
				stale, err := e.s.AcknowledgeBatch(e.ctx, rs)
				return len(rs) - len(stale), err
			}}
		}},
		{"Extend", func(stream string) prepared {
			rs := receipts(stream)
			return prepared{ids(rs), func() (int, error) {
				_, stale, err := e.s.ExtendBatch(e.ctx, rs, lease)
				return len(rs) - len(stale), err
			}}
		}},
		{"Release", func(stream string) prepared {
			rs := receipts(stream)
			return prepared{ids(rs), func() (int, error) { return e.s.Release(e.ctx, rs...) }}
		}},
		{"Requeue", func(stream string) prepared {
			rs := receipts(stream)
			for _, r := range rs {
				if _, err := e.s.Fail(e.ctx, r, outbox.Failure{Reason: "dead", MaxAttempts: 1}); err != nil {
					t.Fatal(err)
				}
			}
			dead := ids(rs)
			return prepared{dead, func() (int, error) { return e.s.Requeue(e.ctx, stream, dead...) }}
		}},
		{"Purge", func(stream string) prepared {
			rs := receipts(stream)
			if _, err := e.s.AcknowledgeBatch(e.ctx, rs); err != nil {
				t.Fatal(err)
			}
			// The highest id was delivered first: a purge that locks in
			// delivery order would take it first.
			all := ids(rs)
			for _, id := range all {
				e.db.Exec(t, e.q("UPDATE millpond_deliveries SET delivered_at = ? WHERE id = ?"), 1_000_000_000-id, id)
			}
			return prepared{all, func() (int, error) {
				got, err := e.s.Purge(e.ctx, 0, n)
				return int(got), err
			}}
		}},
	}
	for _, c := range cases {
		func() { // not subtests: the env's helpers fail e.t
			p := c.prepare("lock-" + strings.ToLower(c.name))
			rows := slices.Sorted(slices.Values(p.ids))
			last := rows[len(rows)-1]
			if e.db.Dialect == "postgres" {
				// Rewrite the rows in a random order, so that their places in
				// the heap (the order of a sequential scan) are not id order.
				for _, id := range shuffled(rows) {
					e.db.Exec(t, "UPDATE millpond_deliveries SET claimed_by = claimed_by WHERE id = $1", id)
				}
			}
			tx, _, rollback := e.db.BeginRaw(t)
			released := false
			release := func() {
				if !released {
					released = true
					rollback()
				}
			}
			defer release()
			e.lockRow(t, tx, last)
			done := make(chan callResult, 1)
			go func() {
				changed, err := p.call()
				done <- callResult{changed, err}
			}()
			// Correct order: the call locks every other row, then waits for
			// the highest. Any other order leaves some of them unlocked for
			// as long as it waits.
			others := rows[:len(rows)-1]
			deadline := time.Now().Add(15 * time.Second)
			for {
				free := e.unlockedRows(t, others)
				if len(free) == 0 {
					break
				}
				select {
				case r := <-done:
					t.Fatalf("%s returned (%d rows, %v) while another transaction held row %d", c.name, r.n, r.err, last)
				default:
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s waits for row %d (the highest id) with %d of the other %d rows not locked (%v): it does not lock in id order",
						c.name, last, len(free), len(others), free)
				}
				time.Sleep(10 * time.Millisecond)
			}
			release()
			var got callResult
			select {
			case got = <-done:
			case <-time.After(30 * time.Second):
				t.Fatalf("%s did not return once the lock was released", c.name)
			}
			if got.err != nil || got.n != n {
				t.Fatalf("%s: changed %d rows, %v; want %d", c.name, got.n, got.err, n)
			}
		}()
	}
}

func shuffled(ids []int64) []int64 {
	out := slices.Clone(ids)
	rand.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// callResult is what a store call running in a goroutine returned.
type callResult struct {
	n   int
	err error
}

// lockRow locks one outbox row in tx (pgx.Tx or *sql.Tx).
func (e *env) lockRow(t *testing.T, tx any, id int64) {
	t.Helper()
	var err error
	switch tx := tx.(type) {
	case pgx.Tx:
		err = tx.QueryRow(e.ctx, "SELECT id FROM millpond_deliveries WHERE id = $1 FOR UPDATE", id).Scan(&id)
	case *sql.Tx:
		err = tx.QueryRowContext(e.ctx, "SELECT id FROM millpond_deliveries WHERE id = ? FOR UPDATE", id).Scan(&id)
	default:
		err = fmt.Errorf("unexpected transaction type %T", tx)
	}
	if err != nil {
		t.Fatalf("lock row %d: %v", id, err)
	}
}

// unlockedRows returns those of the rows that no transaction holds: a
// locking read that skips locked rows, in its own short transaction.
func (e *env) unlockedRows(t *testing.T, ids []int64) []int64 {
	t.Helper()
	list := make([]string, len(ids))
	for i, id := range ids {
		list[i] = strconv.FormatInt(id, 10)
	}
	query := "SELECT id FROM millpond_deliveries WHERE id IN (" + strings.Join(list, ", ") + ") ORDER BY id FOR UPDATE SKIP LOCKED"
	var free []int64
	scan := func(next func() bool, scan func(...any) error) {
		for next() {
			var id int64
			if err := scan(&id); err != nil {
				t.Fatal(err)
			}
			free = append(free, id)
		}
	}
	if e.db.Pool != nil {
		rows, err := e.db.Pool.Query(e.ctx, query)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		scan(rows.Next, rows.Scan)
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return free
	}
	rows, err := e.db.SQL.QueryContext(e.ctx, query)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	scan(rows.Next, rows.Scan)
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return free
}
