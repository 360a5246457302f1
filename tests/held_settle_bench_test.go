package tests

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// BenchmarkHeldClaimSettle measures a held claim of 1,000 events and its
// settle, every event delivered, with the store deleting delivered rows
// (WithDeleteOnAck), as a holding Subscriber runs over a backlog: the
// client's time and allocations per event (the database's time is in the
// wall time too). The events are enqueued again, untimed, for each
// iteration.
//
//	go test ./tests -run '^$' -bench HeldClaimSettle -benchmem
func BenchmarkHeldClaimSettle(b *testing.B) {
	for _, dialect := range []string{"postgres", "mysql"} {
		b.Run(dialect, func(b *testing.B) {
			db := testdb.New(b, dialect)
			store := db.Store(b, outbox.WithDeleteOnAck())
			ctx := context.Background()
			const n = 1000
			fill := backlog(b, db, store, n, 0)
			req := outbox.ClaimRequest{Stream: "s", Worker: "bench", Limit: n, Lease: time.Minute, MaxAttempts: outbox.MaxAttempts}
			ids := make([]int64, 0, n)
			b.ReportAllocs()
			for b.Loop() {
				b.StopTimer()
				fill()
				b.StartTimer()
				h, got, err := store.ClaimHeld(ctx, req)
				if err != nil || len(got) != n {
					b.Fatalf("claimed %d, %v", len(got), err)
				}
				ids = ids[:0]
				for _, c := range got {
					ids = append(ids, c.ID)
				}
				if _, err := h.Settle(ctx, ids, nil); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n)/1000, "µs/event")
		})
	}
}

// BenchmarkHoldingSubscriber measures a holding Subscriber (HoldClaims,
// WithDeleteOnAck, batch 1,000, 8 in flight) delivering a backlog of
// 5,000 events to a reader that acks each message: the client's
// allocations and time per event (the database's time is in the wall time
// too). The backlog is enqueued again, untimed, for each iteration.
//
//	go test ./tests -run '^$' -bench HoldingSubscriber -benchmem
func BenchmarkHoldingSubscriber(b *testing.B) {
	for _, dialect := range []string{"postgres", "mysql"} {
		b.Run(dialect, func(b *testing.B) {
			db := testdb.New(b, dialect)
			store := db.Store(b, outbox.WithDeleteOnAck(), outbox.WithoutListen())
			const n = 5000
			fill := backlog(b, db, store, n, 0)
			msgs := benchSubscribe(b, store, outbox.SubscriberConfig{BatchSize: 1000, MaxInFlight: 8, HoldClaims: true, HoldClaimsAfter: -1, PollInterval: 5 * time.Millisecond})
			drain(b, msgs, n, fill)
		})
	}
}

// BenchmarkOrderedSubscriber measures a leased Subscriber (batch 1,000, 8
// in flight) delivering a backlog of 5,000 events with ordering keys, ten
// per key, to a reader that acks each message: each key's next event is
// handed over by the acknowledgement of the previous one
// (Store.AcknowledgeAndClaimNext). Beside it, the same Subscriber over the
// same backlog without ordering keys. The client's allocations and time
// per event (the database's time is in the wall time too).
//
//	go test ./tests -run '^$' -bench OrderedSubscriber -benchmem
func BenchmarkOrderedSubscriber(b *testing.B) {
	for _, dialect := range []string{"postgres", "mysql"} {
		for _, keys := range []int{0, 500} {
			name := dialect + "/unordered"
			if keys > 0 {
				name = fmt.Sprintf("%s/keys-%d", dialect, keys)
			}
			b.Run(name, func(b *testing.B) {
				db := testdb.New(b, dialect)
				store := db.Store(b)
				const n = 5000
				fill := backlog(b, db, store, n, keys)
				msgs := benchSubscribe(b, store, outbox.SubscriberConfig{BatchSize: 1000, MaxInFlight: 8, PollInterval: 5 * time.Millisecond})
				drain(b, msgs, n, fill)
			})
		}
	}
}

// benchSubscribe subscribes a Subscriber of cfg to stream "s"; it is
// closed at the end of the benchmark.
func benchSubscribe(b *testing.B, store *outbox.Store, cfg outbox.SubscriberConfig) <-chan *message.Message {
	sub, err := outbox.NewSubscriber(store, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = sub.Close() })
	msgs, err := sub.Subscribe(context.Background(), "s")
	if err != nil {
		b.Fatal(err)
	}
	return msgs
}

// drain times, per iteration, the delivery of a backlog that fill
// enqueues (untimed) to a reader that acks each message, and reports the
// time per event.
func drain(b *testing.B, msgs <-chan *message.Message, n int, fill func()) {
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		fill()
		b.StartTimer()
		// One timer per backlog, not per message: the benchmark
		// counts the Subscriber's allocations.
		timeout := time.NewTimer(time.Minute)
		for range n {
			select {
			case m := <-msgs:
				m.Ack()
			case <-timeout.C:
				b.Fatalf("the backlog of %d events was not delivered within a minute", n)
			}
		}
		timeout.Stop()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n)/1000, "µs/event")
}

// backlog returns a function that enqueues n new events of ~200 bytes,
// with one metadata entry, on stream "s" in one transaction; with keys
// above 0, the i-th event has ordering key i mod keys.
func backlog(b *testing.B, db *testdb.Database, store *outbox.Store, n, keys int) func() {
	md := map[string]string{"trace": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	next := 0
	return func() {
		tx, commit, rollback := db.Begin(b)
		for range n {
			next++
			ev := outbox.Event{Stream: "s", Key: fmt.Sprintf("e%d", next), Kind: "K", Payload: make([]byte, 200), Metadata: md}
			if keys > 0 {
				ev.OrderingKey = fmt.Sprintf("k%d", next%keys)
			}
			if _, err := store.Enqueue(context.Background(), tx, ev); err != nil {
				rollback()
				b.Fatal(err)
			}
		}
		if err := commit(); err != nil {
			b.Fatal(err)
		}
	}
}
