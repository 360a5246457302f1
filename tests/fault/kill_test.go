package fault

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

const envLease = "MILLPOND_FAULT_LEASE" // claim lease of the kill worker

// TestWorkerKilledMidBatch claims a batch in a child process with a short
// lease, lets it handle and acknowledge half, leaves it blocked inside the
// transaction that handles the next event, and SIGKILLs it. A fresh
// consumer must then get exactly the unacknowledged half, once each, after
// the lease and not before, so that every event ends delivered exactly once
// and none is lost.
func TestWorkerKilledMidBatch(t *testing.T) {
	for _, dialect := range []string{"postgres", "sqlite"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			testWorkerKilled(t, dialect)
		})
	}
}

func testWorkerKilled(t *testing.T, dialect string) {
	const n = 100
	const lease = 2 * time.Second
	const stream = "kill"
	ctx := context.Background()
	db := testdb.New(t, dialect)
	store := db.Store(t)
	db.Exec(t, "CREATE TABLE fault_handled (event_id BIGINT PRIMARY KEY, handled_by VARCHAR(64) NOT NULL)")
	enqueueN(t, db, store, stream, "ev", n)

	start := time.Now()
	c := startChild(t, "victim", "kill-worker", envURL+"="+db.URL, envStream+"="+stream, envLease+"="+lease.String())
	f := c.expect(t, "CLAIMED", 30*time.Second, nil)
	expiresMicro, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		t.Fatalf("bad CLAIMED line %q: %v", f, err)
	}
	leaseExpires := time.UnixMicro(expiresMicro)
	claimed := parseIDs(t, f[2:])
	if len(claimed) != n {
		t.Fatalf("child claimed %d events, want all %d", len(claimed), n)
	}
	acked := parseIDs(t, c.expect(t, "ACKED", 30*time.Second, nil)[1:])
	handling := parseIDs(t, c.expect(t, "HANDLING", 30*time.Second, nil)[1:])
	c.expect(t, "READY", 30*time.Second, nil)

	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL: %v", err)
	}
	err = c.wait(t, 10*time.Second)
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("child exit: %v, want killed by a signal", err)
	}
	if ws, ok := exit.Sys().(syscall.WaitStatus); ok && (!ws.Signaled() || ws.Signal() != syscall.SIGKILL) {
		t.Fatalf("child exit status %v, want SIGKILL", exit)
	}
	killedAt := time.Now()
	t.Logf("%s: child claimed %d, acknowledged %d, was inside the handling of event %v when SIGKILLed %s after start",
		dialect, len(claimed), len(acked), handling, killedAt.Sub(start).Round(time.Millisecond))

	counts := statusCounts(t, db, stream)
	if counts[outbox.StatusDelivered] != int64(len(acked)) || counts[outbox.StatusProcessing] != int64(n-len(acked)) {
		t.Fatalf("after the kill: %v, want %d delivered and %d processing", counts, len(acked), n-len(acked))
	}
	if got := db.Count(t, "SELECT COUNT(*) FROM fault_handled"); got != int64(len(acked)) {
		t.Fatalf("%d handled rows after the kill, want the %d acknowledged ones (the open transaction must roll back)", got, len(acked))
	}

	// The dead worker's lease still holds: nothing is claimable yet.
	if time.Until(leaseExpires) > 500*time.Millisecond {
		early, err := store.Claim(ctx, outbox.ClaimRequest{Stream: stream, Worker: "thief", Limit: n, Lease: time.Minute, MaxAttempts: 5})
		if err != nil {
			t.Fatal(err)
		}
		if len(early) > 0 {
			t.Fatalf("claimed %d events %s before the dead worker's lease expired", len(early), time.Until(leaseExpires))
		}
	} else {
		t.Logf("lease nearly over (%s left); skipped the before-expiry claim check", time.Until(leaseExpires))
	}
	time.Sleep(time.Until(leaseExpires) + 50*time.Millisecond)

	// A fresh consumer: handle = insert the handled row, then Ack.
	sub, err := outbox.NewSubscriber(store, outbox.SubscriberConfig{Worker: "survivor", Lease: 10 * time.Second, PollInterval: 50 * time.Millisecond, MaxInFlight: 4})
	if err != nil {
		t.Fatal(err)
	}
	subCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	msgs, err := sub.Subscribe(subCtx, stream)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	attempts := map[int64][]string{} // event id -> attempt of each delivery
	var handleErrs []error
	all := make(chan struct{})
	go func() {
		for msg := range msgs {
			id, _ := strconv.ParseInt(msg.Metadata.Get(outbox.MetadataEventID), 10, 64)
			err := insertHandled(db, id, "survivor")
			mu.Lock()
			attempts[id] = append(attempts[id], msg.Metadata.Get(outbox.MetadataAttempt))
			if err != nil {
				handleErrs = append(handleErrs, fmt.Errorf("event %d: %w", id, err))
			}
			if len(attempts) == n-len(acked) {
				select {
				case <-all:
				default:
					close(all)
				}
			}
			mu.Unlock()
			msg.Ack()
		}
	}()
	select {
	case <-all:
	case <-time.After(20 * time.Second):
	}
	time.Sleep(200 * time.Millisecond) // room for a wrong extra delivery to show
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()

	ackedSet := map[int64]bool{}
	for _, id := range acked {
		ackedSet[id] = true
	}
	var lost, twice, redeliveredAcked []int64
	for _, id := range claimed {
		got := attempts[id]
		switch {
		case ackedSet[id] && len(got) > 0:
			redeliveredAcked = append(redeliveredAcked, id)
		case !ackedSet[id] && len(got) == 0:
			lost = append(lost, id)
		case len(got) > 1:
			twice = append(twice, id)
		case !ackedSet[id] && got[0] != "2":
			t.Errorf("event %d redelivered as attempt %q, want 2", id, got[0])
		}
	}
	slices.Sort(lost)
	if len(lost) > 0 || len(twice) > 0 || len(redeliveredAcked) > 0 || len(handleErrs) > 0 {
		t.Fatalf("after the kill: %d never redelivered %v, %d redelivered more than once %v, %d acknowledged by the dead worker yet redelivered %v, handler errors %v",
			len(lost), lost, len(twice), twice, len(redeliveredAcked), redeliveredAcked, handleErrs)
	}
	counts = statusCounts(t, db, stream)
	if counts[outbox.StatusDelivered] != n || counts[outbox.StatusPending]+counts[outbox.StatusProcessing]+counts[outbox.StatusDead] != 0 {
		t.Fatalf("final rows %v, want all %d delivered and nothing else", counts, n)
	}
	if got := db.Count(t, "SELECT COUNT(*) FROM fault_handled"); got != n {
		t.Fatalf("%d handled rows, want %d", got, n)
	}
	if got := db.Count(t, "SELECT COUNT(*) FROM fault_handled WHERE handled_by = 'victim'"); got != int64(len(acked)) {
		t.Fatalf("%d rows handled by the dead worker, want %d", got, len(acked))
	}
	t.Logf("%s: %d of %d events redelivered once each %s after the kill (lease %s); %d delivered, 0 lost, 0 duplicates",
		dialect, len(attempts), n, time.Since(killedAt).Round(time.Millisecond), lease, counts[outbox.StatusDelivered])
}

func parseIDs(t *testing.T, fields []string) []int64 {
	t.Helper()
	ids := make([]int64, len(fields))
	for i, f := range fields {
		id, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			t.Fatalf("bad id %q from child: %v", f, err)
		}
		ids[i] = id
	}
	return ids
}

// insertHandled records that a handler processed an event; the primary key
// refuses a second handling.
func insertHandled(db *testdb.Database, id int64, by string) error {
	var err error
	if db.Pool != nil {
		_, err = db.Pool.Exec(context.Background(), "INSERT INTO fault_handled (event_id, handled_by) VALUES ($1, $2)", id, by)
	} else {
		_, err = db.SQL.Exec("INSERT INTO fault_handled (event_id, handled_by) VALUES (?, ?)", id, by)
	}
	if err != nil {
		return fmt.Errorf("insert handled row: %w", err)
	}
	return nil
}

// killWorker is the child of TestWorkerKilledMidBatch: claim one batch,
// handle and acknowledge half, open the handling transaction of the next
// event, report, and block until killed.
func killWorker() error {
	ctx := context.Background()
	lease, err := time.ParseDuration(os.Getenv(envLease))
	if err != nil {
		return fmt.Errorf("lease: %w", err)
	}
	store, err := openStore(ctx)
	if err != nil {
		return err
	}
	raw, dialect, err := openSQL(os.Getenv(envURL))
	if err != nil {
		return err
	}
	name := os.Getenv(envName)
	claimed, err := store.Claim(ctx, outbox.ClaimRequest{Stream: os.Getenv(envStream), Worker: name, Limit: outbox.MaxBatch, Lease: lease, MaxAttempts: 5})
	if err != nil {
		return fmt.Errorf("claim: %w", err)
	}
	if len(claimed) < 2 {
		return fmt.Errorf("claimed %d events, want a batch", len(claimed))
	}
	ids := make([]any, len(claimed))
	for i, c := range claimed {
		ids[i] = c.ID
	}
	emit("CLAIMED %d"+idFormat(len(ids)), append([]any{claimed[0].LeaseExpiresAt.UnixMicro()}, ids...)...)

	half := claimed[:len(claimed)/2]
	insert := "INSERT INTO fault_handled (event_id, handled_by) VALUES (" + placeholder(dialect, 1) + ", " + placeholder(dialect, 2) + ")"
	receipts := make([]outbox.Receipt, len(half))
	for i, c := range half {
		if _, err := raw.ExecContext(ctx, insert, c.ID, name); err != nil {
			return fmt.Errorf("handle event %d: %w", c.ID, err)
		}
		receipts[i] = c.Receipt()
	}
	stale, err := store.AcknowledgeBatch(ctx, receipts)
	if err != nil {
		return fmt.Errorf("acknowledge: %w", err)
	}
	if len(stale) > 0 {
		return fmt.Errorf("%d of %d acknowledgements were stale within the lease", len(stale), len(receipts))
	}
	emit("ACKED"+idFormat(len(half)), ids[:len(half)]...)

	next := claimed[len(half)]
	tx, err := raw.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin handling: %w", err)
	}
	if _, err := tx.ExecContext(ctx, insert, next.ID, name); err != nil {
		return fmt.Errorf("handle event %d: %w", next.ID, err)
	}
	emit("HANDLING %d", next.ID)
	emit("READY")
	select {} // killed here, transaction open, half the batch unsettled
}

func idFormat(n int) string {
	b := make([]byte, 0, 3*n)
	for range n {
		b = append(b, " %d"...)
	}
	return string(b)
}
