package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// cliTerminal runs the command as on a terminal whose operator types input.
func cliTerminal(t *testing.T, input string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	e := &env{ctx: context.Background(), stdout: &out, stderr: &errb, getenv: func(string) string { return "" },
		stdin: strings.NewReader(input), interactive: true}
	code = runEnv(e, args)
	t.Logf("millpond %s (typed %q) -> %d\n%s%s", strings.Join(redactArgs(args), " "), input, code, out.String(), errb.String())
	return code, out.String(), errb.String()
}

// bulkFixture: group billing of stream orders holds 3 dead letters of kind
// OrderPlaced and 1 delivered event; group reserve holds 4 pending events.
func bulkFixture(t *testing.T, dialect string) *testdb.Database {
	t.Helper()
	ctx := context.Background()
	db := testdb.New(t, dialect)
	store := db.Store(t)
	if err := store.RegisterGroup(ctx, "orders", "billing", "OrderPlaced"); err != nil {
		t.Fatal(err)
	}
	tx, commit, rollback := db.Begin(t)
	for i := range 4 {
		if _, err := store.Enqueue(ctx, tx, outbox.Event{Stream: "orders", Key: fmt.Sprintf("order-%d", i), Kind: "OrderPlaced", Payload: []byte("{}")}); err != nil {
			rollback()
			t.Fatal(err)
		}
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}
	cs, err := store.Claim(ctx, outbox.ClaimRequest{Stream: "orders", Group: "billing", Worker: "w", Limit: 10, Lease: time.Minute, MaxAttempts: 1})
	if err != nil || len(cs) != 4 {
		t.Fatalf("claim: %d, %v", len(cs), err)
	}
	if err := store.Acknowledge(ctx, cs[0].Receipt()); err != nil {
		t.Fatal(err)
	}
	for _, c := range cs[1:] {
		if _, err := store.Fail(ctx, c.Receipt(), outbox.Failure{Reason: "card declined", MaxAttempts: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if err := store.RegisterGroup(ctx, "orders", "reserve"); err != nil {
		t.Fatal(err)
	}
	tx, commit, rollback = db.Begin(t)
	for i := range 4 {
		if _, err := store.Enqueue(ctx, tx, outbox.Event{Stream: "orders", Key: fmt.Sprintf("later-%d", i), Kind: "Shipped", Payload: []byte("{}")}); err != nil {
			rollback()
			t.Fatal(err)
		}
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}
	return db
}

// TestBulkDeletesNeedConfirmation: dead discard -kind/-all, groups
// unregister -discard and purge deleted many events at once without a word.
// Now they print what they would delete and how many, and delete only
// with -yes (or, on a terminal, when the operator types the name asked
// for); without it nothing is deleted and they exit 2; -dry-run only
// counts.
func TestBulkDeletesNeedConfirmation(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			db := bulkFixture(t, dialect)
			flagDB := []string{"-db", db.URL}
			dead := func() int64 {
				return db.Count(t, "SELECT COUNT(*) FROM millpond_deliveries WHERE consumer_group = 'billing' AND status = 'dead_letter'")
			}
			if n := dead(); n != 3 {
				t.Fatalf("fixture: %d dead letters, want 3", n)
			}

			// dead discard -all: not confirmed, dry run, wrong answer, -yes.
			discard := append(append([]string{}, flagDB...), "dead", "discard", "-stream", "orders", "-group", "billing", "-all")
			code, stdout, stderr := cli(t, nil, discard...)
			if code != exitUsage || !strings.Contains(stdout, "would discard 3 dead-lettered events of any kind in group billing of stream orders") ||
				!strings.Contains(stderr, "add -yes") || !strings.Contains(stderr, "nothing was discarded") {
				t.Fatalf("discard -all without -yes: code %d, stdout %q, stderr %q", code, stdout, stderr)
			}
			if n := dead(); n != 3 {
				t.Fatalf("discard -all without -yes deleted %d dead letters", 3-n)
			}
			code, stdout, _ = cli(t, nil, append(discard, "-dry-run")...)
			if code != exitOK || !strings.Contains(stdout, "would discard 3 ") || dead() != 3 {
				t.Fatalf("discard -all -dry-run: code %d, stdout %q, %d dead letters left", code, stdout, dead())
			}
			if code, _, _ = cli(t, nil, append(discard, "-dry-run", "-yes")...); code != exitUsage || dead() != 3 {
				t.Fatalf("discard -dry-run -yes: code %d, %d dead letters left", code, dead())
			}
			code, stdout, _ = cli(t, nil, append(flagDB, "dead", "discard", "-stream", "orders", "-group", "billing", "-kind", "OrderPlaced", "-dry-run")...)
			if code != exitOK || !strings.Contains(stdout, "would discard 3 dead-lettered events of kind OrderPlaced") || dead() != 3 {
				t.Fatalf("discard -kind -dry-run: code %d, stdout %q", code, stdout)
			}
			if code, _, _ = cli(t, nil, append(flagDB, "dead", "discard", "-stream", "orders", "-group", "billing", "-kind", "Typo", "-dry-run")...); code != exitNothing {
				t.Fatalf("discard of a kind with no dead letters: code %d, want %d", code, exitNothing)
			}
			code, _, stderr = cliTerminal(t, "orders\n", discard...)
			if code != exitUsage || !strings.Contains(stderr, `Type "billing" to confirm`) || dead() != 3 {
				t.Fatalf("discard -all on a terminal, wrong answer: code %d, stderr %q, %d dead letters left", code, stderr, dead())
			}
			// stdin at its end at once: /dev/null, a character device like a
			// terminal, as under cron. The hint is -yes.
			code, _, stderr = cliTerminal(t, "", discard...)
			if code != exitUsage || !strings.Contains(stderr, "add -yes") || dead() != 3 {
				t.Fatalf("discard -all with stdin at its end: code %d, stderr %q, %d dead letters left", code, stderr, dead())
			}
			code, stdout, _ = cli(t, nil, append(discard, "-yes")...)
			if code != exitOK || strings.TrimSpace(stdout) != "discarded 3 dead-lettered events" || dead() != 0 {
				t.Fatalf("discard -all -yes: code %d, stdout %q, %d dead letters left", code, stdout, dead())
			}

			// groups unregister -discard.
			reserve := func() int64 {
				return db.Count(t, "SELECT COUNT(*) FROM millpond_deliveries WHERE consumer_group = 'reserve'")
			}
			registered := func() int64 {
				return db.Count(t, "SELECT COUNT(*) FROM millpond_subscriptions WHERE consumer_group = 'reserve'")
			}
			unregister := append(append([]string{}, flagDB...), "groups", "unregister", "-stream", "orders", "-group", "reserve", "-discard")
			code, stdout, stderr = cli(t, nil, unregister...)
			if code != exitUsage || !strings.Contains(stdout, "would unregister group reserve from stream orders and discard its 4 pending, 0 processing and 0 dead-lettered events") ||
				!strings.Contains(stderr, "add -yes") || reserve() != 4 || registered() == 0 {
				t.Fatalf("unregister -discard without -yes: code %d, stdout %q, stderr %q, %d rows, %d registrations", code, stdout, stderr, reserve(), registered())
			}
			code, stdout, _ = cli(t, nil, append(unregister, "-dry-run")...)
			if code != exitOK || !strings.Contains(stdout, "would unregister") || reserve() != 4 || registered() == 0 {
				t.Fatalf("unregister -discard -dry-run: code %d, stdout %q, %d rows, %d registrations", code, stdout, reserve(), registered())
			}
			code, _, _ = cliTerminal(t, "reserve\n", unregister...)
			if code != exitOK || reserve() != 0 || registered() != 0 {
				t.Fatalf("unregister -discard confirmed on a terminal: code %d, %d rows, %d registrations", code, reserve(), registered())
			}

			// Now there is nothing left to do: the dry run says so as the
			// command would, with exit 3.
			if code, _, _ = cli(t, nil, append(unregister, "-dry-run")...); code != exitNothing {
				t.Fatalf("unregister -discard -dry-run of a retired group: code %d, want %d", code, exitNothing)
			}

			// purge: the one delivered event.
			time.Sleep(5 * time.Millisecond) // delivered_at is strictly in the past
			delivered := func() int64 {
				return db.Count(t, "SELECT COUNT(*) FROM millpond_deliveries WHERE status = 'delivered'")
			}
			purge := append(append([]string{}, flagDB...), "purge", "-older-than", "0s")
			code, stdout, stderr = cli(t, nil, purge...)
			if code != exitUsage || !strings.Contains(stdout, "would purge 1 delivered events older than 0s") || !strings.Contains(stderr, "add -yes") || delivered() != 1 {
				t.Fatalf("purge without -yes: code %d, stdout %q, stderr %q, %d delivered left", code, stdout, stderr, delivered())
			}
			code, stdout, _ = cli(t, nil, append(purge, "-dry-run")...)
			if code != exitOK || !strings.Contains(stdout, "would purge 1 ") || delivered() != 1 {
				t.Fatalf("purge -dry-run: code %d, stdout %q, %d delivered left", code, stdout, delivered())
			}
			code, stdout, _ = cli(t, nil, append(purge, "-yes")...)
			if code != exitOK || strings.TrimSpace(stdout) != "purged 1 delivered events older than 0s" || delivered() != 0 {
				t.Fatalf("purge -yes: code %d, stdout %q, %d delivered left", code, stdout, delivered())
			}
			// Nothing to purge needs no confirmation.
			if code, stdout, _ = cli(t, nil, purge...); code != exitOK || !strings.Contains(stdout, "purged 0 ") {
				t.Fatalf("purge of nothing: code %d, stdout %q", code, stdout)
			}
		})
	}
}

// TestBulkConfirmInterrupted: Ctrl-C at the confirmation prompt (main
// turns SIGINT into the context's cancellation) ends the command without
// deleting anything, instead of waiting on stdin for a line.
func TestBulkConfirmInterrupted(t *testing.T) {
	db := bulkFixture(t, "sqlite")
	stdin, w := io.Pipe() // the operator types nothing
	defer w.Close()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	var out, errb bytes.Buffer
	e := &env{ctx: ctx, stdout: &out, stderr: &errb, getenv: func(string) string { return "" }, stdin: stdin, interactive: true}
	done := make(chan int, 1)
	go func() {
		done <- runEnv(e, []string{"-db", db.URL, "dead", "discard", "-stream", "orders", "-group", "billing", "-all"})
	}()
	select {
	case code := <-done:
		if code != exitUsage || !strings.Contains(errb.String(), "interrupted") {
			t.Fatalf("interrupted prompt: code %d, stderr %q", code, errb.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the prompt ignored the interrupt")
	}
	if n := db.Count(t, "SELECT COUNT(*) FROM millpond_deliveries WHERE status = 'dead_letter'"); n != 3 {
		t.Fatalf("%d dead letters left after an interrupted prompt, want 3", n)
	}
}

// TestBulkConfirmFlagsUsage: -yes and -dry-run go with the bulk forms only,
// and every bulk command documents them in -h.
func TestBulkConfirmFlagsUsage(t *testing.T) {
	for _, args := range [][]string{
		{"dead", "discard", "-stream", "s", "1", "-yes"},
		{"dead", "discard", "-stream", "s", "1", "-dry-run"},
		{"groups", "unregister", "-stream", "s", "-group", "g", "-yes"},
		{"purge", "-older-than", "1h", "-yes", "-dry-run"},
	} {
		if code, _, _ := cli(t, nil, append([]string{"-db", "sqlite:" + t.TempDir() + "/x.db"}, args...)...); code != exitUsage {
			t.Errorf("%q: code %d, want %d", args, code, exitUsage)
		}
	}
	for _, args := range [][]string{{"dead", "discard", "-h"}, {"groups", "unregister", "-h"}, {"purge", "-h"}} {
		code, _, stderr := cli(t, nil, args...)
		if code != exitOK || !strings.Contains(stderr, "-yes") || !strings.Contains(stderr, "-dry-run") {
			t.Errorf("%q: code %d, usage lacks -yes or -dry-run: %q", args, code, stderr)
		}
	}
	if code, stdout, _ := cli(t, nil, "help"); code != exitOK || !strings.Contains(stdout, "-dry-run") {
		t.Errorf("help lacks -dry-run: %q", stdout)
	}
}

// typedAfter is an operator's terminal: before the typed line is read,
// meanwhile happens (while the prompt waits).
type typedAfter struct {
	meanwhile func()
	line      io.Reader
}

func (r *typedAfter) Read(p []byte) (int, error) {
	if r.meanwhile != nil {
		r.meanwhile()
		r.meanwhile = nil
	}
	return r.line.Read(p)
}

// TestDeadDiscardDeletesWhatWasConfirmed: dead discard -all asks to
// confirm deleting "these 3 dead-lettered events"; an event dead-lettered
// in the group while the operator reads the prompt was never shown to
// them, and stays (for the next discard), as a confirmed purge deletes at
// most the count it showed.
func TestDeadDiscardDeletesWhatWasConfirmed(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			db := bulkFixture(t, dialect)
			store := db.Store(t)
			ctx := context.Background()
			deadLetterOne := func() {
				tx, commit, rollback := db.Begin(t)
				if _, err := store.Enqueue(ctx, tx, outbox.Event{Stream: "orders", Key: "order-meanwhile", Kind: "OrderPlaced", Payload: []byte("{}")}); err != nil {
					rollback()
					t.Error(err)
					return
				}
				if err := commit(); err != nil {
					t.Error(err)
					return
				}
				cs, err := store.Claim(ctx, outbox.ClaimRequest{Stream: "orders", Group: "billing", Worker: "w", Limit: 10, Lease: time.Minute, MaxAttempts: 1})
				if err != nil || len(cs) != 1 {
					t.Errorf("claim: %d, %v", len(cs), err)
					return
				}
				if _, err := store.Fail(ctx, cs[0].Receipt(), outbox.Failure{Reason: "card declined", MaxAttempts: 1}); err != nil {
					t.Error(err)
				}
			}
			var out, errb bytes.Buffer
			e := &env{ctx: ctx, stdout: &out, stderr: &errb, getenv: func(string) string { return "" },
				stdin: &typedAfter{meanwhile: deadLetterOne, line: strings.NewReader("billing\n")}, interactive: true}
			code := runEnv(e, []string{"-db", db.URL, "dead", "discard", "-stream", "orders", "-group", "billing", "-all"})
			t.Logf("-> %d\n%s%s", code, out.String(), errb.String())
			if code != exitOK || !strings.Contains(out.String(), "would discard 3 ") || !strings.Contains(out.String(), "discarded 3 dead-lettered events") {
				t.Fatalf("confirmed discard: code %d, stdout %q", code, out.String())
			}
			left := db.Count(t, "SELECT COUNT(*) FROM millpond_deliveries WHERE consumer_group = 'billing' AND status = 'dead_letter'")
			if left != 1 {
				t.Fatalf("%d dead letters of billing left, want the 1 dead-lettered while the prompt waited", left)
			}
		})
	}
}
