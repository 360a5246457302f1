package fault

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/outbox/anydb"
)

const (
	heldKillEvents = 300
	heldKillBatch  = 20
	heldKillStream = "held-kill"
	heldKillLease  = time.Minute
)

// TestHeldSubscriberKilled: a consumer process whose Subscriber holds its
// claims (HoldClaims; PostgreSQL and MariaDB) handles events, each handling logging a
// row in its own transaction before the Ack, and is SIGKILLed after about a
// third. Its lease is a minute. What is asserted:
//
//   - right after the kill nothing waits for that minute: every event is
//     delivered or pending, none processing, none locked, and no attempt was
//     counted for the events the dead consumer held;
//   - a fresh consumer (also holding its claims) delivers the rest within
//     seconds;
//   - every event ends delivered, at attempt 1; each was handled at least
//     once; events delivered before the kill were not handled again, and
//     the events handled twice (handled by the dead consumer, their batch
//     not yet settled) are at most the three batches it could hold.
func TestHeldSubscriberKilled(t *testing.T) {
	for _, dialect := range []string{"postgres", "mysql"} {
		t.Run(dialect, func(t *testing.T) { testHeldSubscriberKilled(t, dialect) })
	}
}

// heldLogInsert logs a handling in fault_held_log, in the dialect's
// placeholders.
func heldLogInsert(dialect string) string {
	if dialect == "postgres" {
		return "INSERT INTO fault_held_log (event_id, handled_by) VALUES ($1, $2)"
	}
	return "INSERT INTO fault_held_log (event_id, handled_by) VALUES (?, ?)"
}

func testHeldSubscriberKilled(t *testing.T, dialect string) {
	ctx := context.Background()
	db := testdb.New(t, dialect)
	store := db.Store(t)
	if dialect == "postgres" {
		db.Exec(t, "CREATE TABLE fault_held_log (id BIGSERIAL PRIMARY KEY, event_id BIGINT NOT NULL, handled_by TEXT NOT NULL)")
	} else {
		db.Exec(t, "CREATE TABLE fault_held_log (id BIGINT AUTO_INCREMENT PRIMARY KEY, event_id BIGINT NOT NULL, handled_by VARCHAR(16) NOT NULL)")
	}
	enqueueN(t, db, store, heldKillStream, "ev", heldKillEvents)

	c := startChild(t, "victim", "held-worker", envURL+"="+db.URL, envStream+"="+heldKillStream)
	for {
		f := c.expect(t, "HANDLED", 30*time.Second, nil)
		if n, _ := strconv.Atoi(f[1]); n >= heldKillEvents/3 {
			break
		}
	}
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL: %v", err)
	}
	err := c.wait(t, 10*time.Second)
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("child exit: %v, want killed by a signal", err)
	}
	killedAt := time.Now()

	// The dead consumer's session ends with its process; wait for the
	// database to notice (its backend exits), then look.
	waitUntil(t, 10*time.Second, "the dead consumer's locks released", func() bool {
		if dialect == "mysql" {
			// Every open transaction of the test's database is the dead
			// consumer's: the test keeps none open.
			return db.Count(t, `SELECT COUNT(*) FROM information_schema.INNODB_TRX t
JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id WHERE p.DB = DATABASE()`) == 0
		}
		return db.Count(t, `SELECT COUNT(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid WHERE a.application_name = 'held-victim'`) == 0
	})
	counts := statusCounts(t, db, heldKillStream)
	delivered := counts[outbox.StatusDelivered]
	if counts[outbox.StatusProcessing] != 0 || delivered+counts[outbox.StatusPending] != heldKillEvents {
		t.Fatalf("after the kill: %v, want every event delivered or pending", counts)
	}
	if n := db.Count(t, "SELECT COUNT(*) FROM millpond_outbox WHERE stream = '"+heldKillStream+"' AND status = 'pending' AND attempts <> 0"); n != 0 {
		t.Fatalf("%d pending events had an attempt counted by the dead consumer, want 0", n)
	}
	handledByVictim := db.Count(t, "SELECT COUNT(DISTINCT event_id) FROM fault_held_log")
	if handledByVictim < heldKillEvents/3 || delivered > handledByVictim {
		t.Fatalf("the victim handled %d events and %d are delivered", handledByVictim, delivered)
	}
	db.Exec(t, "CREATE TABLE fault_held_delivered AS SELECT id FROM millpond_outbox WHERE stream = '"+heldKillStream+"' AND status = 'delivered'")

	// A fresh consumer, well inside the dead one's one-minute lease.
	sub, err := outbox.NewSubscriber(store, outbox.SubscriberConfig{
		Worker: "survivor", HoldClaims: true, HoldClaimsAfter: -1, BatchSize: heldKillBatch, MaxInFlight: 4, Lease: heldKillLease, PollInterval: 20 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	subCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	msgs, err := sub.Subscribe(subCtx, heldKillStream)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for msg := range msgs {
			id, _ := strconv.ParseInt(msg.Metadata.Get(outbox.MetadataEventID), 10, 64)
			if _, err := store.SQLDB().ExecContext(ctx, heldLogInsert(dialect), id, "survivor"); err != nil {
				msg.Nack()
				continue
			}
			msg.Ack()
		}
	}()
	waitUntil(t, 20*time.Second, "every event delivered", func() bool {
		return statusCounts(t, db, heldKillStream)[outbox.StatusDelivered] == heldKillEvents
	})
	took := time.Since(killedAt)
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}

	if n := db.Count(t, "SELECT COUNT(*) FROM millpond_outbox WHERE stream = '"+heldKillStream+"' AND attempts <> 1"); n != 0 {
		t.Errorf("%d events delivered at an attempt other than 1", n)
	}
	if n := db.Count(t, "SELECT COUNT(DISTINCT event_id) FROM fault_held_log"); n != heldKillEvents {
		t.Errorf("%d distinct events handled, want %d", n, heldKillEvents)
	}
	if n := db.Count(t, "SELECT COUNT(*) FROM fault_held_log l JOIN fault_held_delivered d ON d.id = l.event_id WHERE l.handled_by = 'survivor'"); n != 0 {
		t.Errorf("%d events delivered before the kill were handled again", n)
	}
	twice := db.Count(t, "SELECT COUNT(*) - COUNT(DISTINCT event_id) FROM fault_held_log")
	if twice > 3*heldKillBatch {
		t.Errorf("%d handlings repeated, want at most %d (three held batches)", twice, 3*heldKillBatch)
	}
	if n := db.Count(t, "SELECT COUNT(*) FROM fault_held_log l WHERE handled_by = 'survivor' AND EXISTS (SELECT 1 FROM fault_held_log v WHERE v.event_id = l.event_id AND v.handled_by = 'survivor' AND v.id <> l.id)"); n != 0 {
		t.Errorf("the survivor handled %d events twice", n)
	}
	t.Logf("victim delivered %d and handled %d of %d events; the survivor delivered the rest %s after the kill (lease %s); %d handlings repeated",
		delivered, handledByVictim, heldKillEvents, took.Round(time.Millisecond), heldKillLease, twice)
}

// waitUntil polls cond every 20 ms for up to timeout.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// heldWorker is the child of TestHeldSubscriberKilled: a holding Subscriber
// whose handler logs each event in a transaction of its own, takes 10 ms,
// and acks; it reports how many it handled until it is killed.
func heldWorker() error {
	ctx := context.Background()
	u, err := url.Parse(os.Getenv(envURL))
	if err != nil {
		return err
	}
	dialect := "mysql"
	if u.Scheme == "postgres" || u.Scheme == "postgresql" {
		dialect = "postgres"
		q := u.Query()
		q.Set("application_name", "held-victim") // the parent waits for this session to end
		u.RawQuery = q.Encode()
	}
	store, err := anydb.Open(ctx, u.String(), outbox.WithoutListen())
	if err != nil {
		return err
	}
	sub, err := outbox.NewSubscriber(store, outbox.SubscriberConfig{
		Worker: "victim", HoldClaims: true, HoldClaimsAfter: -1, BatchSize: heldKillBatch, MaxInFlight: 4, Lease: heldKillLease,
	})
	if err != nil {
		return err
	}
	msgs, err := sub.Subscribe(ctx, os.Getenv(envStream))
	if err != nil {
		return err
	}
	sqlDB := store.SQLDB()
	var handled atomic.Int64
	for range 4 {
		go func() {
			for msg := range msgs {
				id, _ := strconv.ParseInt(msg.Metadata.Get(outbox.MetadataEventID), 10, 64)
				if _, err := sqlDB.ExecContext(ctx, heldLogInsert(dialect), id, "victim"); err != nil {
					fmt.Fprintln(os.Stderr, "log:", err)
					msg.Nack()
					continue
				}
				time.Sleep(10 * time.Millisecond)
				emit("HANDLED %d", handled.Add(1))
				msg.Ack()
			}
		}()
	}
	select {} // until killed
}
