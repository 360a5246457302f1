package tests

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// BenchmarkClaimOverHeldEvents measures what ClaimRequest.After saves a
// claimer that holds many claimed events, as the relay does over a
// backlog: 2,000 events claimed and held, then claims of 1,000 of the
// 1,000 due events after them, from the oldest (stepping over the held
// ones) or after the largest held id. Each claimed batch is released
// (untimed) for the next iteration.
//
//	go test ./tests -run '^$' -bench ClaimOverHeldEvents -benchtime 50x
func BenchmarkClaimOverHeldEvents(b *testing.B) {
	for _, dialect := range testdb.Dialects {
		b.Run(dialect, func(b *testing.B) {
			db := testdb.New(b, dialect)
			store := db.Store(b)
			ctx := context.Background()
			const held, due = 2000, 1000
			tx, commit, rollback := db.Begin(b)
			for i := range held + due {
				if _, err := store.Enqueue(ctx, tx, outbox.Event{Stream: "s", Key: fmt.Sprintf("e%d", i), Kind: "K", Payload: make([]byte, 200)}); err != nil {
					rollback()
					b.Fatal(err)
				}
			}
			if err := commit(); err != nil {
				b.Fatal(err)
			}
			req := outbox.ClaimRequest{Stream: "s", Worker: "bench", Limit: outbox.MaxBatch, Lease: time.Hour, MaxAttempts: outbox.MaxAttempts}
			var holding []outbox.Claimed
			for len(holding) < held {
				got, err := store.Claim(ctx, req)
				if err != nil || len(got) != outbox.MaxBatch {
					b.Fatalf("claimed %d, %v", len(got), err)
				}
				holding = append(holding, got...)
			}
			if dialect == "postgres" {
				db.Exec(b, "ANALYZE millpond_events, millpond_deliveries")
			}
			for _, mode := range []string{"from-oldest", "after-held"} {
				b.Run(mode, func(b *testing.B) {
					req := req
					req.Limit = due
					if mode == "after-held" {
						req.After = holding[held-1].ID
					}
					for b.Loop() {
						got, err := store.Claim(ctx, req)
						if err != nil || len(got) != due {
							b.Fatalf("claimed %d, %v", len(got), err)
						}
						b.StopTimer()
						rs := make([]outbox.Receipt, len(got))
						for i, c := range got {
							rs[i] = c.Receipt()
						}
						if _, err := store.Release(ctx, rs...); err != nil {
							b.Fatal(err)
						}
						b.StartTimer()
					}
				})
			}
		})
	}
}
