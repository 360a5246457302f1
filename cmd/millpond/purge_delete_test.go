package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// TestPurgeDeleteOnAck: on a store whose acknowledgements delete rows,
// purge -delete-on-ack deletes the acknowledged events (no row left) older
// than the horizon; plain purge leaves them.
func TestPurgeDeleteOnAck(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.New(t, dialect)
			store := db.Store(t, outbox.WithDeleteOnAck())
			for _, k := range []string{"a", "b", "c"} {
				tx, commit, _ := db.Begin(t)
				if _, err := store.Enqueue(ctx, tx, outbox.Event{Stream: "s", Key: k, Kind: "K", Payload: []byte("{}")}); err != nil {
					t.Fatal(err)
				}
				if err := commit(); err != nil {
					t.Fatal(err)
				}
			}
			cs, err := store.Claim(ctx, outbox.ClaimRequest{Stream: "s", Worker: "w", Limit: 2, Lease: time.Minute, MaxAttempts: 3})
			if err != nil || len(cs) != 2 {
				t.Fatalf("claim: %d, %v", len(cs), err)
			}
			for _, c := range cs {
				if err := store.Acknowledge(ctx, c.Receipt()); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(5 * time.Millisecond) // created_at is strictly in the past
			flagDB := []string{"-db", db.URL}
			code, stdout, _ := cli(t, nil, append(flagDB, "purge", "-older-than", "0s")...)
			if code != 0 || !strings.Contains(stdout, "purged 0 ") {
				t.Fatalf("purge without -delete-on-ack: code %d, output %q", code, stdout)
			}
			code, stdout, _ = cli(t, nil, append(flagDB, "purge", "-older-than", "0s", "-delete-on-ack")...)
			if code != 0 || !strings.Contains(stdout, "purged 2 ") {
				t.Fatalf("purge -delete-on-ack: code %d, output %q", code, stdout)
			}
			if n := db.Count(t, "SELECT COUNT(*) FROM millpond_events"); n != 1 {
				t.Fatalf("%d events left, want the pending one", n)
			}
		})
	}
}
