package fault

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/outbox/anydb"
)

const (
	crashEvents      = 40
	crashLateAt      = 12                      // where the poison event comes in PoisonAfterTheWindow
	envPoison        = "MILLPOND_FAULT_POISON" // the payload of the poison event
	crashBatch       = 5
	crashLease       = 2 * time.Second
	crashMaxAttempts = 3
	crashStream      = "held-crash"
	crashExit        = 7 // the exit status of a crash on the poison event
	crashMostRuns    = 12
)

// TestHeldSubscriberCrashLoop: an event whose handling kills the process
// (a crash, not a panic: os.Exit, nothing deferred runs) must not stall a
// Subscriber with HoldClaims for good. A held claim counts no attempt, so
// a process that crashed holding the event would take it again, held,
// after every restart. With HoldClaimsAfter at its default (twice the
// lease), a restarted subscription claims under leases first: each crash
// after the first counts an attempt, the event is dead-lettered and the
// stream goes on. The parent restarts the consumer after every crash, up
// to crashMostRuns times, and gives each run 30 s to crash or finish.
// Two cases: the poison event is due from the start (the first run
// claims it under a lease), or it is enqueued once the first run holds
// its claims (its first crash counts nothing). What is asserted:
//
//   - the poison event ends dead-lettered at MaxAttempts, after at most
//     twice MaxAttempts crashes (MaxAttempts, or one more when it arrived
//     in a held claim, on a machine that is not starved);
//   - every event ends settled: delivered, or dead-lettered beside the
//     poison event, claimed with it and left unacknowledged by every
//     crash, as with leases (at most the batch claimed ahead of it).
//
// With HoldClaimsAfter negative (held from the first claim) the poison is
// never dead-lettered: every run crashes on it and the test fails.
func TestHeldSubscriberCrashLoop(t *testing.T) {
	t.Run("PoisonDueAtStart", func(t *testing.T) { testHeldCrashLoop(t, 0, false) })
	t.Run("PoisonAfterTheWindow", func(t *testing.T) { testHeldCrashLoop(t, crashLateAt, true) })
}

// testHeldCrashLoop runs the crash loop with event number poison as the
// poison event, enqueued with the rest, or late. It is the oldest event
// due whenever a run takes it: no event claimed before it in its batch
// has an ack that a crash could lose, and the events dead-lettered beside
// it can only be those claimed behind it.
func testHeldCrashLoop(t *testing.T, poison int, late bool) {
	db := testdb.New(t, "postgres")
	store := db.Store(t)
	first := crashEvents
	if late {
		first = poison // the poison and the events after it come later
	}
	enqueueN(t, db, store, crashStream, "ev", first)
	settled := func() bool {
		c := statusCounts(t, db, crashStream)
		return c[outbox.StatusDelivered]+c[outbox.StatusDead] == crashEvents
	}
	crashes := 0
	for !settled() {
		if crashes == crashMostRuns {
			t.Fatalf("%d crashes and the stream is not settled: %v; the poison event: %s", crashes,
				statusCounts(t, db, crashStream), poisonState(t, db, poison))
		}
		c := startChild(t, fmt.Sprintf("crasher-%d", crashes+1), "held-crasher", envURL+"="+db.URL, envStream+"="+crashStream,
			envPoison+"="+strconv.Itoa(poison))
		if late && crashes == 0 {
			// Once the first run's window is over and it has delivered
			// what came first, the rest arrives: the poison in a held claim.
			c.expect(t, "SUBSCRIBED", 30*time.Second, nil)
			window := time.Now().Add(2*crashLease + 300*time.Millisecond)
			waitUntil(t, 30*time.Second, "the events before the poison delivered", func() bool {
				return statusCounts(t, db, crashStream)[outbox.StatusDelivered] == int64(poison)
			})
			time.Sleep(time.Until(window))
			if err := enqueueRange(context.Background(), db, store, crashStream, "ev", poison, crashEvents); err != nil {
				t.Fatal(err)
			}
		}
		deadline := time.Now().Add(30 * time.Second)
		crashed := false
		for !crashed && !settled() {
			if time.Now().After(deadline) {
				t.Fatalf("run %d neither crashed nor settled the stream within 30 s: %v; the poison event: %s",
					crashes+1, statusCounts(t, db, crashStream), poisonState(t, db, poison))
			}
			select {
			case <-c.done:
				var exit *exec.ExitError
				if !errors.As(c.err, &exit) || exit.ExitCode() != crashExit {
					t.Fatalf("run %d ended with %v, want exit status %d (a crash on the poison event); stderr:\n%s",
						crashes+1, c.err, crashExit, c.stderr())
				}
				crashes++
				crashed = true
			case <-time.After(50 * time.Millisecond):
			}
		}
		if !crashed {
			_ = c.cmd.Process.Kill()
			_ = c.wait(t, 10*time.Second)
		}
	}
	counts := statusCounts(t, db, crashStream)
	if st := poisonState(t, db, poison); st != fmt.Sprintf("%s %d", outbox.StatusDead, crashMaxAttempts) {
		t.Errorf("the poison event: %s, want %s %d", st, outbox.StatusDead, crashMaxAttempts)
	}
	// A crash counts no attempt when the poison event was held (it arrived
	// after the window, or a run reached it only after its window): at
	// worst every other crash counts, since a held crash leaves the event
	// due at once for the next run's first, leased claims.
	if most := 2 * crashMaxAttempts; crashes > most {
		t.Errorf("%d crashes before the poison event was dead-lettered, want at most %d", crashes, most)
	}
	// The subscription claims ahead: a batch waits in its queue while its
	// one handler has the poison event.
	if most := int64(crashBatch + 1); counts[outbox.StatusDead] > most {
		t.Errorf("%d events dead-lettered, want at most the poison event and a batch claimed ahead (%d)", counts[outbox.StatusDead], most)
	}
	t.Logf("%d crashes; then %v", crashes, counts)
}

// poisonState is the status and attempts of event number poison.
func poisonState(t *testing.T, db *testdb.Database, poison int) string {
	t.Helper()
	var status string
	var attempts int
	err := db.Pool.QueryRow(context.Background(), "SELECT status, attempts FROM millpond_outbox WHERE stream = $1 AND event_key = $2",
		crashStream, "ev-"+strconv.Itoa(poison)).Scan(&status, &attempts)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%s %d", status, attempts)
}

// heldCrasher is the child of TestHeldSubscriberCrashLoop: a Subscriber
// with HoldClaims (HoldClaimsAfter at its default) that acks every event
// but the poison one, whose handling ends the process at once.
func heldCrasher() error {
	ctx := context.Background()
	store, err := anydb.Open(ctx, os.Getenv(envURL), outbox.WithoutListen())
	if err != nil {
		return err
	}
	sub, err := outbox.NewSubscriber(store, outbox.SubscriberConfig{
		Worker: os.Getenv(envName), HoldClaims: true, BatchSize: crashBatch, MaxInFlight: 1,
		Lease: crashLease, MaxAttempts: crashMaxAttempts, PollInterval: 20 * time.Millisecond,
		Backoff: func(int) time.Duration { return 0 },
	})
	if err != nil {
		return err
	}
	msgs, err := sub.Subscribe(ctx, os.Getenv(envStream))
	if err != nil {
		return err
	}
	emit("SUBSCRIBED")
	for msg := range msgs {
		if string(msg.Payload) == os.Getenv(envPoison) {
			os.Exit(crashExit)
		}
		msg.Ack()
	}
	return nil
}
