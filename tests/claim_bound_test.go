package tests

import (
	"slices"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// TestLeasedSubscriberClaimBound: over a backlog a leased Subscriber's
// claims start after its last full claim (ClaimRequest.After), so they do
// not read again the rows it has claimed and not yet acknowledged (rows
// another consumer makes due below the bound wait for it to age out).
// Events
// that become due below that bound are still delivered while the backlog
// is being worked through, not after it: a retry of its own Nack (its
// due time drops the bound, so a retry comes with the first claim after
// its backoff) and an
// event whose lease, taken by another
// consumer, expires (the bound stands at most a quarter of a second), and
// the next event of a key whose head the handler acknowledged in its own
// transaction (that acknowledgement drops the bound too).
func TestLeasedSubscriberClaimBound(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			for name, run := range map[string]func(*testing.T, *env){
				"RetryDuringBacklog": func(t *testing.T, e *env) {
					testRetryDuringBacklog(t, e, func(cfg outbox.SubscriberConfig) <-chan *message.Message {
						_, msgs := subscribe(t, e.s, cfg, "held")
						return msgs
					})
				},
				"ImmediateRetryDuringBacklog":    testImmediateRetryDuringBacklog,
				"RetryAfterBackoffDuringBacklog": testRetryAfterBackoffDuringBacklog,
				"ExpiredLeaseDuringBacklog":      testExpiredLeaseDuringBacklog,
				"ClaimsStartAboveTheBound":       testClaimsStartAboveTheBound,
				"OrderedAckInTxDuringBacklog":    testOrderedAckInTxDuringBacklog,
			} {
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					run(t, newEnv(t, dialect, false))
				})
			}
		})
	}
}

// testClaimsStartAboveTheBound shows the bound at work: another consumer
// holds the eight oldest events and, during the backlog, fails them one at
// a time without backoff, which the Subscriber is not told of. Claimed
// from the oldest, each would come within the next claim (about one queue
// of 10 messages later); claims that start above the bound leave it until
// the bound ages out (up to 250 ms, here up to about 150 messages), so
// with eight tries at least one must come more than 20 messages late
// (however slow the machine, a try lands within 20 messages of the
// bound's end with a probability well under a half), and every one within
// a second.
func testClaimsStartAboveTheBound(t *testing.T, e *env) {
	const n, tries = 2000, 8
	e.enqueueAll(keyedEvents("bound", n)...)
	held, err := e.s.Claim(e.ctx, outbox.ClaimRequest{Stream: "bound", Worker: "other", Limit: tries, Lease: time.Hour, MaxAttempts: outbox.MaxAttempts})
	if err != nil || len(held) != tries {
		t.Fatalf("claim of the %d oldest events: %d, %v", tries, len(held), err)
	}
	_, msgs := subscribe(t, e.s, outbox.SubscriberConfig{BatchSize: 10, MaxInFlight: 1}, "bound")
	failedAt := map[string]int{}          // key -> message count when it was failed
	failedSince := map[string]time.Time{} // key -> when
	gaps := []int{}
	next := 0
	for i := 0; len(gaps) < tries; i++ {
		if i == n {
			t.Fatalf("only %d of the %d failed events came back", len(gaps), tries)
		}
		if i == 200+200*next && next < tries {
			c := held[next]
			if _, err := e.s.Fail(e.ctx, c.Receipt(), outbox.Failure{Reason: "other consumer gave up", MaxAttempts: outbox.MaxAttempts}); err != nil {
				t.Fatal(err)
			}
			failedAt[c.Key], failedSince[c.Key] = i, time.Now()
			next++
		}
		m := receive(t, msgs, 10*time.Second)
		if at, ok := failedAt[m.UUID]; ok {
			gaps = append(gaps, i-at)
			if d := time.Since(failedSince[m.UUID]); d > time.Second {
				t.Errorf("%s came %s after it was failed, want within the bound's 250 ms (and a second of slack)", m.UUID, d)
			}
		}
		time.Sleep(1500 * time.Microsecond)
		m.Ack()
	}
	if slices.Max(gaps) <= 20 {
		t.Fatalf("events made due below the bound came %v messages later: the claims did not start above the bound", gaps)
	}
	t.Logf("events made due below the bound came %v messages later", gaps)
}

// testExpiredLeaseDuringBacklog: another consumer claims the oldest event
// under a short lease and never settles it; a Subscriber working through
// the backlog behind it gets that event once the lease has expired, during
// the backlog.
func testExpiredLeaseDuringBacklog(t *testing.T, e *env) {
	const n = 3000
	e.enqueueAll(keyedEvents("bound", n)...)
	got, err := e.s.Claim(e.ctx, outbox.ClaimRequest{Stream: "bound", Worker: "gone", Limit: 1, Lease: time.Second, MaxAttempts: outbox.MaxAttempts})
	if err != nil || len(got) != 1 || got[0].Key != "k0000" {
		t.Fatalf("claim of the oldest event: %v, %v", got, err)
	}
	_, msgs := subscribe(t, e.s, outbox.SubscriberConfig{BatchSize: 100, MaxInFlight: 4}, "bound")
	seen := map[string]bool{}
	expiredAfter := -1
	for len(seen) < n {
		m := receive(t, msgs, 10*time.Second)
		if m.UUID == "k0000" {
			expiredAfter = len(seen)
		}
		seen[m.UUID] = true
		time.Sleep(time.Millisecond) // about 4 s of backlog
		m.Ack()
	}
	if expiredAfter < 0 || expiredAfter > n*7/10 {
		t.Fatalf("the event whose lease expired came after %d of %d events were handled, want it during the backlog", expiredAfter, n)
	}
	t.Logf("the event whose lease expired came after %d of %d events", expiredAfter, n)
}

// testRetryAfterBackoffDuringBacklog: the subscription remembers when the
// retry of each of its Nacks comes due, and its first claim from then on
// starts below the bound, so events nacked with a 30 ms backoff come again
// soon after that. Had the Nack only dropped the bound, the next full
// claim would set a new one and each retry would wait for it to age out:
// 250 ms or more after its Nack, every time (268-283 ms, measured). Of
// eight retries at least half must come within 220 ms of their Nack (on a
// loaded machine one in five came later, after a stall).
func testRetryAfterBackoffDuringBacklog(t *testing.T, e *env) {
	const n, tries, backoff, soon = 2000, 8, 30 * time.Millisecond, 220 * time.Millisecond
	e.enqueueAll(keyedEvents("bound", n)...)
	_, msgs := subscribe(t, e.s, outbox.SubscriberConfig{
		BatchSize: 10, MaxInFlight: 1, Backoff: func(int) time.Duration { return backoff },
	}, "bound")
	nacked := map[string]time.Time{}
	var after []time.Duration
	early := 0
	for i := 0; len(after) < tries; i++ {
		if i == n {
			t.Fatalf("%d of the %d nacked events came again", len(after), tries)
		}
		m := receive(t, msgs, 10*time.Second)
		time.Sleep(1500 * time.Microsecond)
		if at, ok := nacked[m.UUID]; ok {
			d := time.Since(at)
			after = append(after, d.Round(time.Millisecond))
			if d < soon {
				early++
			}
		} else if i >= 200 && i%150 == 50 && len(nacked) < tries {
			nacked[m.UUID] = time.Now()
			m.Nack()
			continue
		}
		m.Ack()
	}
	if early < tries/2 {
		t.Fatalf("nacked with a %s backoff, %d of %d came again within %s of their Nack (after %v), want at least %d", backoff, early, tries, soon, after, tries/2)
	}
	t.Logf("nacked with a %s backoff, they came again after %v", backoff, after)
}

// testImmediateRetryDuringBacklog: a Nack's retry without backoff is due
// at once, which drops the claim bound, so the event comes again within
// the next claim, not
// when the bound has aged out (a quarter of a second: about 150 events
// here).
func testImmediateRetryDuringBacklog(t *testing.T, e *env) {
	const n = 1000
	e.enqueueAll(keyedEvents("bound", n)...)
	_, msgs := subscribe(t, e.s, outbox.SubscriberConfig{
		BatchSize: 10, MaxInFlight: 1, Backoff: func(int) time.Duration { return 0 },
	}, "bound")
	var nackedAt, retriedAt int
	for i := 0; retriedAt == 0; i++ {
		if i == n {
			t.Fatal("the nacked event did not come again")
		}
		m := receive(t, msgs, 10*time.Second)
		time.Sleep(1500 * time.Microsecond)
		switch {
		case m.UUID == "k0300" && nackedAt == 0:
			nackedAt = i
			m.Nack()
			continue
		case m.UUID == "k0300":
			retriedAt = i
		}
		m.Ack()
	}
	if retriedAt-nackedAt > 40 {
		t.Fatalf("the event nacked at message %d came again at message %d, want within the next claims", nackedAt, retriedAt)
	}
	t.Logf("the event nacked at message %d came again at message %d", nackedAt, retriedAt)
}

// testOrderedAckInTxDuringBacklog: the handler acknowledges the head of an
// ordering key in its own transaction (AcknowledgeMessageInTx), which makes
// the key's next event pending below the claim bound that the backlog's
// first claim set; that acknowledgement drops the bound, so the next event
// comes within the next claims, not when the bound has aged out (a quarter
// of a second: about 150 events here).
func testOrderedAckInTxDuringBacklog(t *testing.T, e *env) {
	const n = 1000
	head, next := event("bound", "o1"), event("bound", "o2")
	head.OrderingKey, next.OrderingKey = "o", "o"
	e.enqueueAll(append([]outbox.Event{head, next}, keyedEvents("bound", n)...)...)
	_, msgs := subscribe(t, e.s, outbox.SubscriberConfig{BatchSize: 10, MaxInFlight: 1}, "bound")
	headAt, nextAt := -1, -1
	for i := 0; nextAt < 0; i++ {
		if i == n+2 {
			t.Fatal("the key's next event did not come")
		}
		m := receive(t, msgs, 10*time.Second)
		time.Sleep(1500 * time.Microsecond)
		switch m.UUID {
		case "o1":
			headAt = i
			tx, commit, rollback := e.db.Begin(t)
			if err := outbox.AcknowledgeMessageInTx(e.ctx, tx, m); err != nil {
				rollback()
				t.Fatal(err)
			}
			if err := commit(); err != nil {
				t.Fatal(err)
			}
		case "o2":
			nextAt = i
		}
		m.Ack()
	}
	if headAt < 0 || nextAt-headAt > 40 {
		t.Fatalf("the head acknowledged in the handler's transaction came at message %d, the key's next event at message %d, want within the next claims", headAt, nextAt)
	}
	t.Logf("the head acknowledged in the handler's transaction came at message %d, the key's next event at message %d", headAt, nextAt)
}
