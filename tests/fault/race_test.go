package fault

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

const envWorkers = "MILLPOND_FAULT_WORKERS" // goroutines per race worker process

// TestProcessesRaceForEvents runs 4 child processes of 8 workers each that
// claim (batches of 50, 30 s lease) and acknowledge the same 4,000 events.
// Every event must be claimed once, acknowledged once, by one worker, and
// nothing may remain undelivered.
func TestProcessesRaceForEvents(t *testing.T) {
	for _, dialect := range []string{"postgres", "mysql"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			testRace(t, dialect)
		})
	}
}

func testRace(t *testing.T, dialect string) {
	const (
		n         = 4000
		processes = 4
		workers   = 8
		stream    = "race"
	)
	db := testdb.New(t, dialect)
	store := db.Store(t)
	began := time.Now()
	enqueueN(t, db, store, stream, "ev", n)
	t.Logf("%s: enqueued %d events in %s", dialect, n, time.Since(began).Round(time.Millisecond))
	want := rowIDs(t, db, stream)
	if len(want) != n {
		t.Fatalf("%d rows enqueued, want %d", len(want), n)
	}

	children := make([]*child, processes)
	for p := range children {
		children[p] = startChild(t, fmt.Sprintf("p%d", p), "race-worker",
			envURL+"="+db.URL, envStream+"="+stream, envWorkers+"="+strconv.Itoa(workers))
	}
	for _, c := range children {
		c.expect(t, "READY", 30*time.Second, nil)
	}
	start := time.Now()
	for _, c := range children {
		if _, err := fmt.Fprintln(c.stdin, "GO"); err != nil {
			t.Fatalf("start %s: %v", c.name, err)
		}
	}

	ackedBy := map[int64]string{}
	claimedBy := map[int64][]string{}
	var doubleAck, stale []string
	perWorker := map[string]int{}
	for _, c := range children {
		done := c.expect(t, "DONE", 60*time.Second, func(f []string) {
			if len(f) < 2 {
				return
			}
			worker := f[1]
			for _, id := range parseIDs(t, f[2:]) {
				switch f[0] {
				case "CLAIMED":
					claimedBy[id] = append(claimedBy[id], worker)
				case "ACKED":
					if prev, ok := ackedBy[id]; ok {
						doubleAck = append(doubleAck, fmt.Sprintf("%d by %s and %s", id, prev, worker))
					}
					ackedBy[id] = worker
					perWorker[worker]++
				case "STALE":
					stale = append(stale, fmt.Sprintf("%d by %s", id, worker))
				}
			}
		})
		if err := c.wait(t, 10*time.Second); err != nil {
			t.Fatalf("child %s: %v; stderr:\n%s", c.name, err, c.stderr())
		}
		t.Logf("%s: %s", c.name, strings.Join(done[1:], " "))
		if msgs := strings.TrimSpace(c.stderr()); msgs != "" {
			t.Logf("%s retried transient errors:\n%s", c.name, msgs)
		}
	}
	elapsed := time.Since(start)

	var doubleClaim, missing []string
	for _, id := range want {
		if len(claimedBy[id]) > 1 {
			doubleClaim = append(doubleClaim, fmt.Sprintf("%d by %v", id, claimedBy[id]))
		}
		if _, ok := ackedBy[id]; !ok {
			missing = append(missing, strconv.FormatInt(id, 10))
		}
	}
	counts := statusCounts(t, db, stream)
	reclaimed := db.Count(t, "SELECT COUNT(*) FROM millpond_outbox WHERE stream = 'race' AND attempts <> 1")
	minW, maxW := n, 0
	for _, k := range perWorker {
		minW, maxW = min(minW, k), max(maxW, k)
	}
	t.Logf("%s: %d events, %d processes x %d workers, %s (%.0f events/s); acknowledged %d by %d workers (%d-%d each); %d double acks, %d double claims, %d stale acks, %d missing; rows %v",
		dialect, n, processes, workers, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds(),
		len(ackedBy), len(perWorker), minW, maxW, len(doubleAck), len(doubleClaim), len(stale), len(missing), counts)
	if len(doubleAck) > 0 {
		t.Errorf("%d events acknowledged by two workers: %v", len(doubleAck), first(doubleAck, 10))
	}
	if len(doubleClaim) > 0 {
		t.Errorf("%d events claimed twice under a 30 s lease: %v", len(doubleClaim), first(doubleClaim, 10))
	}
	if len(stale) > 0 {
		t.Errorf("%d acknowledgements were stale under a 30 s lease: %v", len(stale), first(stale, 10))
	}
	if len(missing) > 0 {
		t.Errorf("%d events were never acknowledged: %v", len(missing), first(missing, 10))
	}
	if len(ackedBy) != n {
		t.Errorf("%d distinct events acknowledged, want %d", len(ackedBy), n)
	}
	if counts[outbox.StatusDelivered] != n || reclaimed != 0 {
		t.Errorf("rows %v with %d claimed more than once; want all %d delivered at attempt 1", counts, reclaimed, n)
	}
}

func first(s []string, k int) []string { return s[:min(k, len(s))] }

// rowIDs returns the ids of every row of the stream.
func rowIDs(t *testing.T, db *testdb.Database, stream string) []int64 {
	t.Helper()
	const q = "SELECT id FROM millpond_outbox WHERE stream = '%s' ORDER BY id"
	var rows interface {
		Next() bool
		Scan(...any) error
		Err() error
	}
	if db.Pool != nil {
		r, err := db.Pool.Query(context.Background(), fmt.Sprintf(q, stream))
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		rows = r
	} else {
		r, err := db.SQL.Query(fmt.Sprintf(q, stream))
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		rows = r
	}
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// raceWorker is a child of TestProcessesRaceForEvents: after GO on stdin,
// run the workers until the stream has nothing left to claim, reporting each
// claimed and each acknowledged id.
func raceWorker() error {
	ctx := context.Background()
	workers, err := strconv.Atoi(os.Getenv(envWorkers))
	if err != nil || workers < 1 {
		return fmt.Errorf("bad %s: %q", envWorkers, os.Getenv(envWorkers))
	}
	store, err := openStore(ctx)
	if err != nil {
		return err
	}
	defer store.Close()
	if _, err := store.Stats(ctx); err != nil { // warm the connection
		return fmt.Errorf("stats: %w", err)
	}
	emit("READY")
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "GO" {
		return fmt.Errorf("waiting for GO: %q, %v", line, err)
	}

	base := os.Getenv(envName)
	stream := os.Getenv(envStream)
	var claims, claimErrs, ackErrs, events atomic.Int64
	var firstErr error
	var errOnce sync.Once
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("%s-w%d", base, w)
			if err := raceLoop(ctx, store, stream, name, &claims, &claimErrs, &ackErrs, &events); err != nil {
				errOnce.Do(func() { firstErr = fmt.Errorf("%s: %w", name, err) })
			}
		}()
	}
	wg.Wait()
	emit("DONE claims=%d events=%d claim_errors=%d ack_errors=%d", claims.Load(), events.Load(), claimErrs.Load(), ackErrs.Load())
	return firstErr
}

func raceLoop(ctx context.Context, store *outbox.Store, stream, name string, claims, claimErrs, ackErrs, events *atomic.Int64) error {
	idle := 0
	for {
		claimed, err := store.Claim(ctx, outbox.ClaimRequest{Stream: stream, Worker: name, Limit: 50, Lease: 30 * time.Second, MaxAttempts: 10})
		if err != nil {
			// Transient errors (a MySQL deadlock, a busy server) are
			// retried, as a real consumer would; too many is a failure.
			if claimErrs.Add(1) > 100 {
				return fmt.Errorf("claim keeps failing: %w", err)
			}
			fmt.Fprintf(os.Stderr, "%s: claim: %v\n", name, err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		claims.Add(1)
		if len(claimed) == 0 {
			// Other workers may hold the remaining rows mid-claim; look a
			// few times before deciding the stream is drained.
			if idle++; idle >= 5 {
				return nil
			}
			time.Sleep(20 * time.Millisecond)
			continue
		}
		idle = 0
		ids := make([]any, len(claimed))
		rs := make([]outbox.Receipt, len(claimed))
		for i, c := range claimed {
			ids[i], rs[i] = c.ID, c.Receipt()
		}
		emit("CLAIMED %s"+idFormat(len(ids)), append([]any{name}, ids...)...)
		var stale []outbox.Receipt
		for attempt := 0; ; attempt++ {
			stale, err = store.AcknowledgeBatch(ctx, rs)
			if err == nil {
				break
			}
			ackErrs.Add(1)
			fmt.Fprintf(os.Stderr, "%s: acknowledge: %v\n", name, err)
			if attempt == 5 {
				return fmt.Errorf("acknowledge keeps failing: %w", err)
			}
			time.Sleep(10 * time.Millisecond)
		}
		staleIDs := map[int64]bool{}
		var staleOut []any
		for _, r := range stale {
			staleIDs[r.ID] = true
			staleOut = append(staleOut, r.ID)
		}
		var ackedOut []any
		for _, id := range ids {
			if !staleIDs[id.(int64)] {
				ackedOut = append(ackedOut, id)
			}
		}
		emit("ACKED %s"+idFormat(len(ackedOut)), append([]any{name}, ackedOut...)...)
		if len(staleOut) > 0 {
			emit("STALE %s"+idFormat(len(staleOut)), append([]any{name}, staleOut...)...)
		}
		events.Add(int64(len(ackedOut)))
	}
}
