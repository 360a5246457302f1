package tests

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// TestFindEvents looks events up by id and by (stream, key) on every
// dialect: every state, the rows of every consumer group, no claim key, and
// the bounds. It also checks the Retrying count of Stats.
func TestFindEvents(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, dialect, true)
			for _, g := range []string{"billing", "shipping"} {
				if err := e.s.RegisterGroup(e.ctx, "orders", g); err != nil {
					t.Fatal(err)
				}
			}
			created := e.clock.Now().Truncate(time.Microsecond)
			ev := outbox.Event{Stream: "orders", Key: "order-1", Kind: "OrderPlaced",
				Payload: []byte{0, 1, 2, 0xff}, Metadata: map[string]string{"trace": "t-1"}}
			first := e.enqueue(ev).ID

			rows, err := e.s.FindEvents(e.ctx, outbox.EventQuery{Stream: "orders", Key: "order-1"})
			if err != nil {
				t.Fatal(err)
			}
			if len(rows) != 2 || rows[0].ID != first || rows[0].Group != "billing" || rows[1].Group != "shipping" {
				t.Fatalf("by key: %+v", rows)
			}
			for _, r := range rows {
				if r.Stream != "orders" || r.Key != "order-1" || r.Kind != "OrderPlaced" || !bytes.Equal(r.Payload, ev.Payload) ||
					r.Metadata["trace"] != "t-1" || r.Status != outbox.StatusPending || r.Attempts != 0 ||
					!r.CreatedAt.Equal(created) || !r.AvailableAt.Equal(created) || !r.DeliveredAt.IsZero() {
					t.Fatalf("row: %+v", r)
				}
			}

			// Billing claims and acknowledges; shipping claims and fails twice
			// (retrying), then dead-letters.
			req := claimReq("orders", 1, time.Minute, 3)
			req.Group = "billing"
			c := e.claimOne(req)
			e.clock.Advance(time.Second)
			if err := e.s.Acknowledge(e.ctx, c.Receipt()); err != nil {
				t.Fatal(err)
			}
			req.Group = "shipping"
			c = e.claimOne(req)
			got, err := e.s.FindEvents(e.ctx, outbox.EventQuery{ID: c.ID})
			if err != nil || len(got) != 1 {
				t.Fatalf("by id: %+v, %v", got, err)
			}
			if p := got[0]; p.Status != outbox.StatusProcessing || p.Attempts != 1 || p.ClaimedBy != "worker-1" ||
				!p.AvailableAt.Equal(c.LeaseExpiresAt) {
				t.Fatalf("processing row: %+v (lease %s)", p, c.LeaseExpiresAt)
			}
			// The claim key appears in no field.
			if strings.Contains(fmt.Sprintf("%+v", []any{got[0].Stream, got[0].Group, got[0].Key, got[0].Kind, string(got[0].Payload),
				got[0].Metadata, got[0].Status, got[0].ClaimedBy, got[0].LastError}), c.ClaimKey) {
				t.Fatal("a field carries the claim key")
			}
			if _, err := e.s.Fail(e.ctx, c.Receipt(), outbox.Failure{Reason: "boom <b>", MaxAttempts: 3, RetryDelay: time.Minute}); err != nil {
				t.Fatal(err)
			}
			st, err := e.s.Stats(e.ctx)
			if err != nil || len(st) != 1 || st[0].Group != "shipping" || st[0].Pending != 1 || st[0].Retrying != 1 {
				t.Fatalf("stats with a retrying event: %+v, %v", st, err)
			}
			e.clock.Advance(time.Minute)
			c = e.claimOne(req)
			if _, err := e.s.Fail(e.ctx, c.Receipt(), outbox.Failure{Reason: "boom again", MaxAttempts: 2}); err != nil {
				t.Fatal(err)
			}
			rows, err = e.s.FindEvents(e.ctx, outbox.EventQuery{Stream: "orders", Key: "order-1"})
			if err != nil || len(rows) != 2 {
				t.Fatalf("after settling: %+v, %v", rows, err)
			}
			if b := rows[0]; b.Status != outbox.StatusDelivered || !b.DeliveredAt.Equal(created.Add(time.Second)) {
				t.Fatalf("delivered row: %+v", b)
			}
			if d := rows[1]; d.Status != outbox.StatusDead || d.Attempts != 2 || d.LastError != "boom again" {
				t.Fatalf("dead row: %+v", d)
			}
			st, err = e.s.Stats(e.ctx)
			if err != nil || len(st) != 1 || st[0].Dead != 1 || st[0].Retrying != 0 || st[0].Pending != 0 {
				t.Fatalf("stats after dead-lettering: %+v, %v", st, err)
			}

			// Nothing found is empty, not an error.
			for _, q := range []outbox.EventQuery{{ID: 999999}, {Stream: "orders", Key: "nope"}, {Stream: "other", Key: "order-1"}} {
				if rows, err := e.s.FindEvents(e.ctx, q); err != nil || len(rows) != 0 {
					t.Fatalf("%+v: %+v, %v", q, rows, err)
				}
			}
			// Bounds.
			for _, bad := range []struct {
				q    outbox.EventQuery
				want error
			}{
				{outbox.EventQuery{}, outbox.ErrInvalidKey},
				{outbox.EventQuery{ID: -1}, outbox.ErrInvalidID},
				{outbox.EventQuery{ID: 1, Stream: "orders", Key: "order-1"}, outbox.ErrInvalidID},
				{outbox.EventQuery{Stream: "orders"}, outbox.ErrInvalidKey},
				{outbox.EventQuery{Stream: "a b", Key: "k"}, outbox.ErrInvalidKey},
			} {
				if _, err := e.s.FindEvents(e.ctx, bad.q); !errors.Is(err, bad.want) {
					t.Errorf("%+v: got %v, want %v", bad.q, err, bad.want)
				}
			}

			// Redaction.
			var logged bytes.Buffer
			slog.New(slog.NewJSONHandler(&logged, nil)).Info("x", "row", rows[1], "rows", rows)
			for _, s := range []string{rows[1].String(), fmt.Sprintf("%#v", rows[1]), fmt.Sprintf("%v", rows), logged.String()} {
				if strings.Contains(s, "order-1") || strings.Contains(s, "orders") || strings.Contains(s, "shipping") {
					t.Errorf("not redacted: %s", s)
				}
			}
		})
	}
}
