package tests

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// TestSubscriberOrderedPipeline: a Subscriber delivering ordered events
// claims the next event of a key when the settlement of its head commits,
// without waiting for a poll, however the head was settled: acked (written
// by the subscriber's acknowledger, which may run two writes at once),
// acknowledged in the handler's own transaction, or dead-lettered under
// DeadLetterSkip. Every case runs with a 30 s poll interval: a missed
// wake-up fails it.
func TestSubscriberOrderedPipeline(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			for _, c := range []struct {
				name string
				run  func(*testing.T, *env)
			}{
				{"ManyKeysDeliverInOrderWithoutPolling", testOrderedPipelineWithoutPolling},
				{"AckInTheHandlersTransactionWakes", func(t *testing.T, e *env) { testOrderedSettleWakes(t, e, "in-tx") }},
				{"SkippedDeadLetterWakes", func(t *testing.T, e *env) { testOrderedSettleWakes(t, e, "skip") }},
				{"ClosingReleasesHandedOverEvents", testCloseReleasesHandedOver},
			} {
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					c.run(t, newEnv(t, dialect, false))
				})
			}
		})
	}
}

// testOrderedPipelineWithoutPolling delivers 4 keys of 15 events each, and
// unordered events among them, through 8 handlers, a third of the ordered
// ones acknowledged in the handler's transaction: every event is handled
// once, each key's in sequence and one at a time, within a time that no
// poll could reach.
func testOrderedPipelineWithoutPolling(t *testing.T, e *env) {
	const keys, perKey, unordered = 4, 15, 6
	for i := range keys * perKey {
		e.enqueue(ordered("p", fmt.Sprintf("e%03d", i), fmt.Sprintf("k%d", i%keys)))
		if i%(keys*perKey/unordered) == 0 {
			e.enqueue(event("p", fmt.Sprintf("u%03d", i)))
		}
	}
	sub, err := outbox.NewSubscriber(e.s, outbox.SubscriberConfig{PollInterval: 30 * time.Second, MaxInFlight: 8, BatchSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	msgs, err := sub.Subscribe(e.ctx, "p")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex
		lastSeq  = map[string]int{}
		inFlight = map[string]bool{}
		handled  = map[string]int{}
		wg       sync.WaitGroup
	)
	done := make(chan struct{})
	total := keys*perKey + unordered
	for range 8 {
		wg.Go(func() {
			for msg := range msgs {
				okey := msg.Metadata.Get(outbox.MetadataOrderingKey)
				seq, _ := strconv.Atoi(msg.Metadata.Get(outbox.MetadataOrderingSeq))
				mu.Lock()
				if okey != "" {
					if inFlight[okey] {
						t.Errorf("two events of %s in flight at once", okey)
					}
					if seq != lastSeq[okey]+1 {
						t.Errorf("key %s: sequence %d after %d", okey, seq, lastSeq[okey])
					}
					inFlight[okey] = true
					lastSeq[okey] = seq
				}
				mu.Unlock()
				time.Sleep(time.Millisecond) // the handler's work
				mu.Lock()
				inFlight[okey] = false
				handled[msg.Metadata.Get(outbox.MetadataEventID)]++
				n := len(handled)
				mu.Unlock()
				if okey != "" && seq%3 == 0 {
					tx, commit, rollback := e.db.Begin(t)
					if err := outbox.AcknowledgeMessageInTx(e.ctx, tx, msg); err != nil {
						rollback()
						t.Errorf("acknowledge in tx: %v", err)
						msg.Nack()
						continue
					}
					if err := commit(); err != nil {
						t.Errorf("commit: %v", err)
					}
				}
				msg.Ack()
				if n == total {
					close(done)
				}
			}
		})
	}
	// A key's 15 events need 15 claims, each after the previous head's
	// acknowledgement: waiting for a 30 s poll even once would fail this.
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		mu.Lock()
		t.Fatalf("handled %d of %d events; sequences reached %v", len(handled), total, lastSeq)
	}
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for id, n := range handled {
		if n != 1 {
			t.Errorf("event %s handled %d times", id, n)
		}
	}
	for k := range keys {
		if okey := fmt.Sprintf("k%d", k); lastSeq[okey] != perKey {
			t.Errorf("key %s reached sequence %d, want %d", okey, lastSeq[okey], perKey)
		}
	}
	if n := e.count("SELECT COUNT(*) FROM millpond_outbox WHERE stream = 'p' AND status = 'delivered'"); n != int64(total) {
		t.Errorf("%d events delivered in the database, want %d (every ack written by Close)", n, total)
	}
}

// testOrderedSettleWakes: the head of a key is settled after the
// subscriber's polls have backed off to seconds; the next event of the key
// must come at once. how is "in-tx" (acknowledged in the handler's
// transaction) or "skip" (nacked at the attempt limit under
// DeadLetterSkip).
func testOrderedSettleWakes(t *testing.T, e *env, how string) {
	e.enqueue(ordered("w", "w1", "k"))
	e.enqueue(ordered("w", "w2", "k"))
	cfg := outbox.SubscriberConfig{PollInterval: 30 * time.Second, MaxInFlight: 4}
	if how == "skip" {
		cfg.MaxAttempts, cfg.DeadLetterPolicy = 1, outbox.DeadLetterSkip
	}
	sub, err := outbox.NewSubscriber(e.s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	msgs, err := sub.Subscribe(context.Background(), "w")
	if err != nil {
		t.Fatal(err)
	}
	var first *message.Message
	select {
	case first = <-msgs:
	case <-time.After(10 * time.Second):
		t.Fatal("the head was not delivered")
	}
	// Let the claim loop's empty polls back off (1 ms doubling: the poll
	// after 3 s comes about 4 s after the claim).
	time.Sleep(3 * time.Second)
	settled := time.Now()
	switch how {
	case "in-tx":
		tx, commit, rollback := e.db.Begin(t)
		if err := outbox.AcknowledgeMessageInTx(e.ctx, tx, first); err != nil {
			rollback()
			t.Fatal(err)
		}
		if err := commit(); err != nil {
			t.Fatal(err)
		}
		first.Ack()
	case "skip":
		first.Nack()
	}
	select {
	case second := <-msgs:
		if gap := time.Since(settled); gap > 700*time.Millisecond {
			t.Fatalf("the next event of the key came %s after the head was settled (%s), want at once", gap, how)
		}
		if second.Metadata.Get(outbox.MetadataOrderingSeq) != "2" {
			t.Fatalf("got sequence %s, want 2", second.Metadata.Get(outbox.MetadataOrderingSeq))
		}
		second.Ack()
	case <-time.After(10 * time.Second):
		t.Fatalf("the next event of the key was not delivered (%s)", how)
	}
}

// testCloseReleasesHandedOver: an ack hands the next event of its key over
// to the subscriber (Store.AcknowledgeAndClaimNext) while its one
// dispatcher is busy with another message; Close releases the event handed
// over (pending again, its attempt refunded) rather than leaving it claimed
// until its lease expires.
func testCloseReleasesHandedOver(t *testing.T, e *env) {
	for _, k := range []string{"a1", "a2"} {
		e.enqueue(ordered("c", k, "a"))
	}
	e.enqueue(ordered("c", "b1", "b"))
	sub, err := outbox.NewSubscriber(e.s, outbox.SubscriberConfig{
		PollInterval: 30 * time.Second, MaxInFlight: 1, BatchSize: 10, CloseTimeout: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	msgs, err := sub.Subscribe(context.Background(), "c")
	if err != nil {
		t.Fatal(err)
	}
	receive := func() *message.Message {
		t.Helper()
		select {
		case msg := <-msgs:
			return msg
		case <-time.After(10 * time.Second):
			t.Fatal("no message")
			return nil
		}
	}
	first := receive()
	if first.Metadata.Get(outbox.MetadataOrderingSeq) != "1" {
		t.Fatalf("first message: %v", first.Metadata)
	}
	first.Ack()
	// The one dispatcher takes the next message at once (b1 from the
	// claimed queue, or a2 if the ack's hand-over came first) and the
	// handler holds it.
	held := receive()
	heldID := held.Metadata.Get(outbox.MetadataEventID)
	deadline := time.Now().Add(10 * time.Second)
	for e.count("SELECT COUNT(*) FROM millpond_outbox WHERE stream = 'c' AND status = 'delivered'") != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the first ack was not written")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	if n := e.count("SELECT COUNT(*) FROM millpond_outbox WHERE stream = 'c' AND status = 'processing' AND id <> ?", heldID); n != 0 {
		t.Fatalf("%d events besides the held one are still claimed after Close", n)
	}
	if n := e.count("SELECT COUNT(*) FROM millpond_outbox WHERE stream = 'c' AND status = 'pending' AND attempts = 0"); n != 1 {
		t.Fatalf("%d events pending with no attempt counted after Close, want 1", n)
	}
	t.Logf("held %s (%s)", heldID, held.Metadata.Get(outbox.MetadataOrderingKey))
}
