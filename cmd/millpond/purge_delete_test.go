package main

import (
	"context"
	"strconv"
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
			// The count before a purge includes the events without rows.
			code, stdout, _ = cli(t, nil, append(flagDB, "purge", "-older-than", "0s", "-delete-on-ack", "-dry-run")...)
			if code != 0 || !strings.Contains(stdout, "would purge 2 ") {
				t.Fatalf("purge -delete-on-ack -dry-run: code %d, output %q", code, stdout)
			}
			code, stdout, _ = cli(t, nil, append(flagDB, "purge", "-older-than", "0s", "-delete-on-ack", "-yes")...)
			if code != 0 || !strings.Contains(stdout, "purged 2 ") {
				t.Fatalf("purge -delete-on-ack: code %d, output %q", code, stdout)
			}
			if n := db.Count(t, "SELECT COUNT(*) FROM millpond_events"); n != 1 {
				t.Fatalf("%d events left, want the pending one", n)
			}
		})
	}
}

// TestDeleteOnAckDatabaseKeepsIdempotencyRecords: on a database whose
// stores run WithDeleteOnAck, an event outlives its rows as its key's
// idempotency record until purge. `dead discard` opened the database
// without the option and deleted the event with its last row: a
// producer's retry of the key was then a new event, delivered again to the
// group that had acknowledged it. With the global -delete-on-ack (or
// $MILLPOND_DELETE_ON_ACK=1) the commands open it as the stores do.
func TestDeleteOnAckDatabaseKeepsIdempotencyRecords(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.New(t, dialect)
			s := db.Store(t, outbox.WithDeleteOnAck())
			for _, g := range []string{"billing", "shipping"} {
				if err := s.RegisterGroup(ctx, "s", g); err != nil {
					t.Fatal(err)
				}
			}
			enqueue := func(key string) outbox.Enqueued {
				t.Helper()
				tx, commit, rollback := db.Begin(t)
				res, err := s.Enqueue(ctx, tx, outbox.Event{Stream: "s", Key: key, Kind: "Placed", Payload: []byte("p")})
				if err != nil {
					rollback()
					t.Fatal(err)
				}
				if err := commit(); err != nil {
					t.Fatal(err)
				}
				return res
			}
			claim := func(group string) outbox.Claimed {
				t.Helper()
				cs, err := s.Claim(ctx, outbox.ClaimRequest{Stream: "s", Group: group, Worker: "w", Limit: 10, Lease: time.Minute, MaxAttempts: 1})
				if err != nil || len(cs) != 1 {
					t.Fatalf("claim %s: %d, %v", group, len(cs), err)
				}
				return cs[0]
			}
			for i, args := range [][]string{{"-delete-on-ack"}, nil} {
				key := "order-" + strconv.Itoa(i)
				env := map[string]string{}
				if args == nil {
					env[EnvDeleteOnAck] = "1"
				}
				enqueue(key)
				// billing handles it (its row deleted), shipping dead-letters it.
				if err := s.Acknowledge(ctx, claim("billing").Receipt()); err != nil {
					t.Fatal(err)
				}
				dead := claim("shipping")
				if _, err := s.Fail(ctx, dead.Receipt(), outbox.Failure{Reason: "poison", MaxAttempts: 1}); err != nil {
					t.Fatal(err)
				}
				cmd := append(append([]string{"-db", db.URL}, args...), "dead", "discard", "-stream", "s", strconv.FormatInt(dead.ID, 10))
				if code, stdout, stderr := cli(t, env, cmd...); code != exitOK {
					t.Fatalf("dead discard: %d %q %q", code, stdout, stderr)
				}
				if res := enqueue(key); res.Inserted {
					t.Errorf("%v %v: after the discard of the last row a retry of the key was inserted again (%+v): billing would get it twice", args, env, res)
				}
			}
		})
	}
}

// TestDeleteOnAckEnvValueChecked: $MILLPOND_DELETE_ON_ACK set to a value
// that is neither true nor false ("yes", "on") was read as false without a
// word, so on a WithDeleteOnAck database a discard then deleted the events
// the operator meant to keep as idempotency records. Such a value is a
// usage error naming the variable, and nothing runs.
func TestDeleteOnAckEnvValueChecked(t *testing.T) {
	db := testdb.New(t, "sqlite")
	ctx := context.Background()
	s := db.Store(t, outbox.WithDeleteOnAck())
	tx, commit, rollback := db.Begin(t)
	if _, err := s.Enqueue(ctx, tx, outbox.Event{Stream: "s", Key: "k", Kind: "Placed", Payload: []byte("p")}); err != nil {
		rollback()
		t.Fatal(err)
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}
	cs, err := s.Claim(ctx, outbox.ClaimRequest{Stream: "s", Worker: "w", Limit: 1, Lease: time.Minute, MaxAttempts: 1})
	if err != nil || len(cs) != 1 {
		t.Fatalf("claim: %d, %v", len(cs), err)
	}
	if _, err := s.Fail(ctx, cs[0].Receipt(), outbox.Failure{Reason: "poison", MaxAttempts: 1}); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"yes", "on", "enabled"} {
		code, _, stderr := cli(t, map[string]string{EnvDeleteOnAck: v}, "-db", db.URL, "dead", "discard", "-stream", "s", strconv.FormatInt(cs[0].ID, 10))
		if code != exitUsage || !strings.Contains(stderr, EnvDeleteOnAck) {
			t.Fatalf("%s=%s: code %d, stderr %q; want %d and a message naming the variable", EnvDeleteOnAck, v, code, stderr, exitUsage)
		}
	}
	for _, v := range []string{"", "0", "1", "true", "TRUE", "false"} {
		if code, _, stderr := cli(t, map[string]string{EnvDeleteOnAck: v}, "-db", db.URL, "stats"); code != exitOK {
			t.Errorf("%s=%q: code %d, stderr %q; want 0", EnvDeleteOnAck, v, code, stderr)
		}
	}
}
