package tests

import (
	"context"
	"testing"
	"time"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

func TestSmoke(t *testing.T) {
	for _, d := range testdb.Dialects {
		t.Run(d, func(t *testing.T) {
			db := testdb.New(t, d)
			s := db.Store(t)
			ctx := context.Background()
			if err := s.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			tx, commit, _ := db.Begin(t)
			res, err := s.Enqueue(ctx, tx, outbox.Event{Stream: "orders", Key: "k1", Kind: "OrderPlaced", Payload: []byte(`{"a":1}`), Metadata: map[string]string{"m": "v"}})
			if err != nil {
				t.Fatal(err)
			}
			res2, err := s.Enqueue(ctx, tx, outbox.Event{Stream: "orders", Key: "k1", Kind: "OrderPlaced", Payload: []byte(`{"a":1}`)})
			if err != nil {
				t.Fatal(err)
			}
			_, err = s.Enqueue(ctx, tx, outbox.Event{Stream: "orders", Key: "k1", Kind: "OrderPlaced", Payload: []byte(`{"a":2}`)})
			t.Log(res, res2, err)
			if err := commit(); err != nil {
				t.Fatal(err)
			}
			cl, err := s.Claim(ctx, outbox.ClaimRequest{Stream: "orders", Worker: "w1", Limit: 10, Lease: time.Minute, MaxAttempts: 3})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%v %v", cl, cl[0].Metadata)
			exp, err := s.Extend(ctx, cl[0].Receipt(), 2*time.Minute)
			t.Log(exp, err)
			stats, err := s.Stats(ctx)
			t.Log(stats, err)
			if err := s.Acknowledge(ctx, cl[0].Receipt()); err != nil {
				t.Fatal(err)
			}
			t.Log(s.Acknowledge(ctx, cl[0].Receipt()))
			n, err := s.Purge(ctx, 0, 10)
			t.Log(n, err)
			if err := s.MigrateDown(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}
