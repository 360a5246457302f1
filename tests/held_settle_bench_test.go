package tests

import (
	"context"
	"fmt"
	"testing"
	"time"

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
			md := map[string]string{"trace": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
			next := 0
			fill := func() {
				tx, commit, rollback := db.Begin(b)
				for range n {
					next++
					if _, err := store.Enqueue(ctx, tx, outbox.Event{Stream: "s", Key: fmt.Sprintf("e%d", next), Kind: "K", Payload: make([]byte, 200), Metadata: md}); err != nil {
						rollback()
						b.Fatal(err)
					}
				}
				if err := commit(); err != nil {
					b.Fatal(err)
				}
			}
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
