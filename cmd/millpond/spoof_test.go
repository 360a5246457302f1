package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// TestDeadListEscapesSpoofingCharacters: `dead list` prints a failure text
// holding a bidirectional override, a zero-width character or a line
// separator with those characters as \u escapes, so the terminal shows what
// is stored (U+202E would turn "001$" into "$100", U+2028 break the row).
func TestDeadListEscapesSpoofingCharacters(t *testing.T) {
	ctx := context.Background()
	db := testdb.New(t, "sqlite")
	store := db.Store(t)
	tx, commit, _ := db.Begin(t)
	if _, err := store.Enqueue(ctx, tx, outbox.Event{Stream: "s", Key: "k", Kind: "K", Payload: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}
	cs, err := store.Claim(ctx, outbox.ClaimRequest{Stream: "s", Worker: "w", Limit: 1, Lease: time.Minute, MaxAttempts: 1})
	if err != nil || len(cs) != 1 {
		t.Fatalf("claim: %d, %v", len(cs), err)
	}
	if _, err := store.Fail(ctx, cs[0].Receipt(), outbox.Failure{Reason: "amount \u202E001$\u202C\u200B\u2028next", MaxAttempts: 1}); err != nil {
		t.Fatal(err)
	}
	code, stdout, _ := cli(t, nil, "-db", db.URL, "dead", "list", "-stream", "s")
	if code != 0 {
		t.Fatalf("dead list: code %d", code)
	}
	for _, r := range []string{"\u202E", "\u202C", "\u200B", "\u2028"} {
		if strings.Contains(stdout, r) {
			t.Errorf("dead list prints U+%04X unescaped:\n%s", []rune(r)[0], stdout)
		}
	}
	if !strings.Contains(stdout, `amount \u202E001$\u202C\u200B\u2028next`) {
		t.Errorf("dead list does not print the failure text escaped:\n%s", stdout)
	}
}
