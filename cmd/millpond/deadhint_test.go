package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// TestDeadListSaysWhereDeadLettersAre: "dead list -stream S" lists the
// default group only, and a mistyped stream lists nothing; both printed an
// empty table and nothing else, so an operator whose dead letters sit in a
// handler's group, or who typed "order" for "orders", was told there were
// none. The table stays empty and the exit 0, and stderr says where to look.
func TestDeadListSaysWhereDeadLettersAre(t *testing.T) {
	db := testdb.New(t, "sqlite")
	ctx := context.Background()
	flagDB := []string{"-db", db.URL}
	if code, _, _ := cli(t, nil, append(flagDB, "migrate")...); code != 0 {
		t.Fatalf("migrate: code %d", code)
	}
	store := db.Store(t)
	if err := store.RegisterGroup(ctx, "orders", "billing"); err != nil {
		t.Fatal(err)
	}
	tx, commit, rollback := db.Begin(t)
	if _, err := store.Enqueue(ctx, tx, outbox.Event{Stream: "orders", Key: "order-1", Kind: "OrderPlaced", Payload: []byte(`{}`)}); err != nil {
		rollback()
		t.Fatal(err)
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}
	claimed, err := store.Claim(ctx, outbox.ClaimRequest{Stream: "orders", Group: "billing", Worker: "w", Limit: 1, Lease: time.Minute, MaxAttempts: 1})
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %d, %v", len(claimed), err)
	}
	if out, err := store.Fail(ctx, claimed[0].Receipt(), outbox.Failure{Reason: "no", MaxAttempts: 1}); err != nil || !out.DeadLettered {
		t.Fatalf("fail: %+v, %v", out, err)
	}

	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"-stream", "orders"}, []string{"-all-groups", "billing"}},
		{[]string{"-stream", "order"}, []string{`"order"`, "orders"}},
	} {
		code, stdout, stderr := cli(t, nil, append(append(flagDB, "dead", "list"), tc.args...)...)
		if code != 0 || strings.Count(strings.TrimSpace(stdout), "\n") != 0 {
			t.Errorf("dead list %v: code %d, stdout %q; want 0 and the header alone", tc.args, code, stdout)
		}
		for _, w := range tc.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("dead list %v: stderr %q does not mention %s", tc.args, stderr, w)
			}
		}
	}
	// Where the list is what was asked for, no hint.
	if code, _, stderr := cli(t, nil, append(flagDB, "dead", "list", "-stream", "orders", "-all-groups")...); code != 0 || stderr != "" {
		t.Errorf("dead list -all-groups: code %d, stderr %q", code, stderr)
	}
}

// TestDeadDiscardSaysWhereDeadLettersAre: "dead discard -kind K" with a
// mistyped kind, or "-group G -all" with a mistyped group, exited 3 with
// "has no dead letters", which reads as "nothing to do" at 3 a.m. Stderr
// now names the kinds the group's dead letters have, or the groups of the
// stream that hold dead letters.
func TestDeadDiscardSaysWhereDeadLettersAre(t *testing.T) {
	db := bulkFixture(t, "sqlite")
	flagDB := []string{"-db", db.URL}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"-group", "billing", "-kind", "OrderPlacd"}, []string{"kinds", "OrderPlaced"}},
		{[]string{"-group", "biling", "-all"}, []string{"billing (3)"}},
		{[]string{"-kind", "OrderPlaced"}, []string{"billing (3)"}},
	} {
		code, _, stderr := cli(t, nil, append(append(flagDB, "dead", "discard", "-stream", "orders"), append(tc.args, "-dry-run")...)...)
		if code != exitNothing {
			t.Errorf("dead discard %v: code %d, want %d", tc.args, code, exitNothing)
		}
		for _, w := range tc.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("dead discard %v: stderr %q does not mention %s", tc.args, stderr, w)
			}
		}
	}
	if n := db.Count(t, "SELECT COUNT(*) FROM millpond_deliveries WHERE status = 'dead_letter'"); n != 3 {
		t.Fatalf("%d dead letters left, want 3", n)
	}
}
