package fault

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// Ordered kill test: keys × perKey events with ordering keys; a consumer
// process handles them with several workers and is SIGKILLed mid-run,
// holding claims (one of them inside an open handling transaction).
const (
	orderedKeys   = 20
	orderedPerKey = 15
	orderedLease  = 2 * time.Second
	orderedStream = "ordered-kill"
)

// TestOrderedConsumerKilled: a consumer process with four workers handles
// events of 20 ordering keys; each handling inserts a row into
// fault_ordered_log and acknowledges the event in the same transaction
// (Store.AcknowledgeInTx). After a third of the events it claims one more
// batch per worker, opens the handling transaction of one of them, and is
// SIGKILLed. What is asserted:
//
//   - while the dead consumer's leases run, no other consumer is handed
//     any event of a key whose head it held (the next event of a key never
//     overtakes a head whose lease has not expired);
//   - after they expire, a fresh consumer (another four workers) handles
//     the rest: every event is handled exactly once (one committed log row
//     per event: a handling commits with its acknowledgement, so a killed
//     handling leaves nothing), and per key the committed handlings are in
//     sequence order 1..15 (the log's serial ids, taken at handling time,
//     grow with the key's sequence: no event of a key was handled before its
//     predecessor's handling had committed with its acknowledgement);
//   - the heads the dead consumer held are redelivered (attempt 2 or more)
//     and every event ends delivered, every key with nothing unsettled.
func TestOrderedConsumerKilled(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			testOrderedKilled(t, dialect)
		})
	}
}

func testOrderedKilled(t *testing.T, dialect string) {
	ctx := context.Background()
	db := testdb.New(t, dialect)
	store := db.Store(t)
	serial := map[string]string{"postgres": "BIGSERIAL PRIMARY KEY", "mysql": "BIGINT AUTO_INCREMENT PRIMARY KEY", "sqlite": "INTEGER PRIMARY KEY AUTOINCREMENT"}[dialect]
	db.Exec(t, "CREATE TABLE fault_ordered_log (n "+serial+", event_id BIGINT NOT NULL, okey VARCHAR(64) NOT NULL, seq BIGINT NOT NULL, attempt INT NOT NULL, handled_by VARCHAR(64) NOT NULL)")
	// One transaction per key, keys round robin: each key's events are
	// interleaved with the others' in id order.
	for i := range orderedKeys * orderedPerKey {
		ev := outbox.Event{Stream: orderedStream, Key: fmt.Sprintf("o-%d", i), Kind: "FaultEvent",
			Payload: []byte(strconv.Itoa(i)), OrderingKey: fmt.Sprintf("key-%02d", i%orderedKeys)}
		tx, commit, rollback := db.Begin(t)
		if _, err := store.Enqueue(ctx, tx, ev); err != nil {
			rollback()
			t.Fatal(err)
		}
		if err := commit(); err != nil {
			t.Fatal(err)
		}
	}

	c := startChild(t, "victim", "ordered-worker", envURL+"="+db.URL, envStream+"="+orderedStream)
	f := c.expect(t, "HELD", 60*time.Second, nil)
	expiresMicro, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		t.Fatalf("bad HELD line %q: %v", f, err)
	}
	leaseExpires := time.UnixMicro(expiresMicro)
	held := map[string]bool{} // keys whose head the victim holds
	for _, k := range f[2:] {
		held[k] = true
	}
	c.expect(t, "READY", 30*time.Second, nil)
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL: %v", err)
	}
	err = c.wait(t, 10*time.Second)
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("child exit: %v, want killed by a signal", err)
	}
	killedAt := time.Now()
	before := db.Count(t, "SELECT COUNT(*) FROM fault_ordered_log")
	if len(held) == 0 || before == 0 || before >= orderedKeys*orderedPerKey {
		t.Fatalf("the victim held %d keys and handled %d events; want some of each", len(held), before)
	}

	// While the dead consumer's leases run, the keys it held give nothing.
	if time.Until(leaseExpires) > 300*time.Millisecond {
		early, err := store.Claim(ctx, outbox.ClaimRequest{Stream: orderedStream, Worker: "thief", Limit: outbox.MaxBatch, Lease: time.Minute, MaxAttempts: 5})
		if err != nil {
			t.Fatal(err)
		}
		rs := make([]outbox.Receipt, 0, len(early))
		for _, cl := range early {
			if held[cl.OrderingKey] {
				t.Errorf("event seq %d of a key the dead consumer held was claimed before its lease expired", cl.OrderingSeq)
			}
			rs = append(rs, cl.Receipt())
		}
		if len(rs) > 0 {
			if _, err := store.Release(ctx, rs...); err != nil {
				t.Fatal(err)
			}
		}
		if time.Until(leaseExpires) < 0 {
			t.Log("the lease expired during the early claim; its check is partial")
		}
	} else {
		t.Logf("lease nearly over (%s left); skipped the before-expiry claim check", time.Until(leaseExpires))
	}
	time.Sleep(time.Until(leaseExpires) + 50*time.Millisecond)

	// A fresh consumer handles the rest.
	raw, _, err := openSQL(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	runCtx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	if err := consumeOrdered(runCtx, store, raw, dialect, "survivor", 4, orderedKeys*orderedPerKey, nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // room for a wrong extra delivery to show
	if extra, err := store.Claim(ctx, outbox.ClaimRequest{Stream: orderedStream, Worker: "late", Limit: 10, Lease: time.Minute, MaxAttempts: 5}); err != nil || len(extra) > 0 {
		t.Fatalf("after everything was handled, a claim got %d events (%v)", len(extra), err)
	}

	// Exactly once, and per key in sequence order.
	rows, err := raw.QueryContext(ctx, "SELECT event_id, okey, seq, attempt, handled_by FROM fault_ordered_log ORDER BY n")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	seen := map[int64]int{}
	next := map[string]int64{}
	redelivered := map[string]bool{}
	total := 0
	for rows.Next() {
		var id, seq int64
		var okey, by string
		var attempt int
		if err := rows.Scan(&id, &okey, &seq, &attempt, &by); err != nil {
			t.Fatal(err)
		}
		total++
		seen[id]++
		if seen[id] > 1 {
			t.Errorf("event %d handled %d times", id, seen[id])
		}
		if want := next[okey] + 1; seq != want {
			t.Errorf("key %s: seq %d handled after seq %d, want %d", okey, seq, next[okey], want)
		}
		next[okey] = seq
		if attempt > 1 {
			redelivered[okey] = true
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if total != orderedKeys*orderedPerKey || len(seen) != total {
		t.Fatalf("%d handlings of %d events, want %d once each", total, len(seen), orderedKeys*orderedPerKey)
	}
	for k := range held {
		if !redelivered[k] {
			t.Errorf("key %s: the head the dead consumer held was not redelivered", k)
		}
	}
	counts := statusCounts(t, db, orderedStream)
	if counts[outbox.StatusDelivered] != orderedKeys*orderedPerKey {
		t.Fatalf("final rows %v, want all delivered", counts)
	}
	if n := db.Count(t, "SELECT COUNT(*) FROM millpond_ordering WHERE unsettled <> 0"); n != 0 {
		t.Fatalf("%d keys still count unsettled events", n)
	}
	t.Logf("%s: victim handled %d events and held %d keys when SIGKILLed; the survivor finished %s after the kill (lease %s); %d events once each, in order per key",
		dialect, before, len(held), time.Since(killedAt).Round(time.Millisecond), orderedLease, total)
}

// consumeOrdered runs workers that claim batches of 5 and handle each
// event in a transaction that logs it and acknowledges it, until the log
// holds total rows. stop, when set, is called after each handling; a true
// result makes the worker return errStop.
func consumeOrdered(ctx context.Context, store *outbox.Store, raw *sql.DB, dialect, name string, workers, total int, stop func() bool) error {
	insert := "INSERT INTO fault_ordered_log (event_id, okey, seq, attempt, handled_by) VALUES (" +
		placeholder(dialect, 1) + ", " + placeholder(dialect, 2) + ", " + placeholder(dialect, 3) + ", " + placeholder(dialect, 4) + ", " + placeholder(dialect, 5) + ")"
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			req := outbox.ClaimRequest{Stream: orderedStream, Worker: fmt.Sprintf("%s-%d", name, w), Limit: 5, Lease: orderedLease, MaxAttempts: 5}
			for ctx.Err() == nil {
				var n int64
				if err := raw.QueryRowContext(ctx, "SELECT COUNT(*) FROM fault_ordered_log").Scan(&n); err != nil {
					errs <- err
					return
				}
				if n >= int64(total) {
					return
				}
				claimed, err := store.Claim(ctx, req)
				if err != nil {
					errs <- err
					return
				}
				if len(claimed) == 0 {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				for _, cl := range claimed {
					if err := handleOrdered(ctx, store, raw, insert, cl, name); err != nil {
						errs <- err
						return
					}
					if stop != nil && stop() {
						errs <- errStop
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return ctx.Err()
}

var errStop = errors.New("stopped")

func handleOrdered(ctx context.Context, store *outbox.Store, raw *sql.DB, insert string, cl outbox.Claimed, name string) error {
	tx, err := raw.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, insert, cl.ID, cl.OrderingKey, cl.OrderingSeq, cl.Attempts, name); err != nil {
		return fmt.Errorf("log event %d: %w", cl.ID, err)
	}
	if err := store.AcknowledgeInTx(ctx, outbox.SQLTx(tx), cl.Receipt()); err != nil {
		return fmt.Errorf("acknowledge event %d: %w", cl.ID, err)
	}
	return tx.Commit()
}

// orderedWorker is the child of TestOrderedConsumerKilled: four workers
// handle events until a third of them are logged; then each claims one
// more batch and holds it, one of them inside an open handling
// transaction. It reports the keys held and blocks until killed.
func orderedWorker() error {
	ctx := context.Background()
	store, err := openStore(ctx)
	if err != nil {
		return err
	}
	raw, dialect, err := openSQL(os.Getenv(envURL))
	if err != nil {
		return err
	}
	name := os.Getenv(envName)
	var handled atomic.Int64
	err = consumeOrdered(ctx, store, raw, dialect, name, 4, orderedKeys*orderedPerKey, func() bool {
		return handled.Add(1) >= orderedKeys*orderedPerKey/3
	})
	if !errors.Is(err, errStop) {
		return fmt.Errorf("consume: %v", err)
	}
	var keys []string
	var expires int64
	for w := range 4 {
		claimed, err := store.Claim(ctx, outbox.ClaimRequest{Stream: os.Getenv(envStream), Worker: fmt.Sprintf("%s-hold-%d", name, w), Limit: 5, Lease: orderedLease, MaxAttempts: 5})
		if err != nil {
			return fmt.Errorf("claim: %w", err)
		}
		for _, cl := range claimed {
			keys = append(keys, cl.OrderingKey)
			if e := cl.LeaseExpiresAt.UnixMicro(); expires == 0 || e > expires {
				expires = e
			}
		}
		if w == 0 && len(claimed) > 0 {
			tx, err := raw.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			insert := "INSERT INTO fault_ordered_log (event_id, okey, seq, attempt, handled_by) VALUES (" +
				placeholder(dialect, 1) + ", " + placeholder(dialect, 2) + ", " + placeholder(dialect, 3) + ", " + placeholder(dialect, 4) + ", " + placeholder(dialect, 5) + ")"
			cl := claimed[0]
			if _, err := tx.ExecContext(ctx, insert, cl.ID, cl.OrderingKey, cl.OrderingSeq, cl.Attempts, name); err != nil {
				return err
			}
			if dialect == "sqlite" {
				// One writer: an open write transaction would stall the
				// parent; the open handling is rolled back by the kill
				// anyway, which the other dialects show.
				_ = tx.Rollback()
			}
		}
	}
	if len(keys) == 0 {
		return errors.New("nothing left to hold")
	}
	emit("HELD %d %s", expires, strings.Join(keys, " "))
	emit("READY")
	select {} // killed here
}
