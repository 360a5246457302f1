package tests

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// TestOrderingCost measures, on PostgreSQL, enqueue and delivery with and
// without ordering keys: 8 producers (one event per transaction), then 8
// claimers (batches of 25, acknowledged in batches). It only reports; run
// it with MILLPOND_ORDERING_PERF=1 (the bench module is the reference).
func TestOrderingCost(t *testing.T) {
	if os.Getenv("MILLPOND_ORDERING_PERF") != "1" {
		t.Skip("set MILLPOND_ORDERING_PERF=1 to measure")
	}
	const events = 8000
	for _, tc := range []struct {
		name string
		keys int // 0: unordered
	}{{"unordered", 0}, {"1000 keys", 1000}, {"10 keys", 10}, {"unordered again", 0}} {
		db := testdb.New(t, "postgres")
		s := db.Store(t, outbox.WithoutListen())
		ctx := context.Background()
		var next atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for range 8 {
			wg.Go(func() {
				for {
					i := next.Add(1) - 1
					if i >= events {
						return
					}
					ev := event("perf", fmt.Sprintf("e%06d", i))
					if tc.keys > 0 {
						ev.OrderingKey = fmt.Sprintf("k%04d", i%int64(tc.keys))
					}
					tx, commit, rollback, err := db.TryBegin()
					if err == nil {
						_, err = s.Enqueue(ctx, tx, ev)
						if err == nil {
							err = commit()
						} else {
							rollback()
						}
					}
					if err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		enqueue := time.Since(start)
		var acked atomic.Int64
		start = time.Now()
		for w := range 8 {
			wg.Go(func() {
				req := outbox.ClaimRequest{Stream: "perf", Worker: fmt.Sprintf("w%d", w), Limit: 25, Lease: time.Minute, MaxAttempts: 3}
				for acked.Load() < events {
					got, err := s.Claim(ctx, req)
					if err != nil {
						t.Error(err)
						return
					}
					if len(got) == 0 {
						time.Sleep(time.Millisecond)
						continue
					}
					rs := make([]outbox.Receipt, len(got))
					for i, c := range got {
						rs[i] = c.Receipt()
					}
					if _, err := s.AcknowledgeBatch(ctx, rs); err != nil {
						t.Error(err)
						return
					}
					acked.Add(int64(len(rs)))
				}
			})
		}
		wg.Wait()
		deliver := time.Since(start)
		t.Logf("%-16s enqueue %6.0f events/s   delivery %6.0f events/s", tc.name,
			events/enqueue.Seconds(), events/deliver.Seconds())
	}
}
