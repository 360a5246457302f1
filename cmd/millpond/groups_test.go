package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// Before the first migrate every command that needs the schema says how to
// install it; the first migrate names what it applied.
func TestMissingSchemaAndFirstMigrate(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			db := testdb.New(t, dialect) // not migrated
			createSQLiteFile(t, db)
			flagDB := []string{"-db", db.URL}
			for _, args := range [][]string{
				{"stats"}, {"stats", "-json"}, {"dead", "list", "-stream", "s"}, {"dead", "requeue", "-stream", "s", "1"},
				{"dead", "reroute", "-stream", "s", "1"}, {"dead", "discard", "-stream", "s", "-all"},
				{"groups", "list"}, {"groups", "unregister", "-stream", "s", "-group", "g"},
				{"pending", "reroute", "-stream", "s"}, {"purge", "-older-than", "1h"},
			} {
				code, stdout, stderr := cli(t, nil, append(flagDB, args...)...)
				want := "the outbox schema is not installed in "
				if code != exitFailure || !strings.Contains(stderr, want) || !strings.Contains(stderr, "run `millpond migrate`") || stdout != "" {
					t.Errorf("%q before migrate: code %d, stdout %q, stderr %q; want %d and %q", args, code, stdout, stderr, exitFailure, want)
				}
				for _, raw := range []string{"does not exist", "doesn't exist", "no such table", "SQLSTATE"} {
					if strings.Contains(stderr, raw) {
						t.Errorf("%q before migrate shows the raw database error: %q", args, stderr)
					}
				}
			}
			ms, err := outbox.Migrations(dialect)
			if err != nil {
				t.Fatal(err)
			}
			var steps []string
			for _, m := range ms {
				steps = append(steps, fmt.Sprintf("%04d %s", m.Version, m.Name))
			}
			latest := ms[len(ms)-1].Version
			code, stdout, _ := cli(t, nil, append(flagDB, "migrate")...)
			want := fmt.Sprintf(" %s; outbox schema at version %d in ", strings.Join(steps, ", "), latest)
			if code != exitOK || !strings.HasPrefix(stdout, "applied migration") || !strings.Contains(stdout, want) {
				t.Fatalf("first migrate: code %d, output %q; want %q", code, stdout, "applied migration(s)"+want)
			}
			code, stdout, _ = cli(t, nil, append(flagDB, "migrate")...)
			if want := fmt.Sprintf("outbox schema is up to date at version %d in ", latest); code != exitOK || !strings.HasPrefix(stdout, want) {
				t.Fatalf("second migrate: code %d, output %q; want %q", code, stdout, want)
			}
			if code, _, _ := cli(t, nil, append(flagDB, "stats")...); code != exitOK {
				t.Fatalf("stats after migrate: code %d", code)
			}
		})
	}
}

// decodeJSON parses a -json output into objects and checks that each has
// exactly the documented fields.
func decodeJSON(t *testing.T, out string, fields ...string) []map[string]any {
	t.Helper()
	var rows []map[string]any
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("not a JSON array: %v\n%s", err, out)
	}
	if rows == nil {
		t.Fatalf("want an array, got %q", out)
	}
	slices.Sort(fields)
	for _, r := range rows {
		var got []string
		for k := range r {
			got = append(got, k)
		}
		slices.Sort(got)
		if !slices.Equal(got, fields) {
			t.Fatalf("JSON fields %q, want %q", got, fields)
		}
	}
	return rows
}

func TestGroupCommands(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			db := testdb.New(t, dialect)
			store := db.Store(t)
			ctx := context.Background()
			flagDB := []string{"-db", db.URL}
			// Keys and payloads that must never be printed.
			secretKey := func(i int) string { return fmt.Sprintf("secret-key-%d", i) }
			const secretPayload = "secret-payload-7f3a"
			enqueue := func(stream, kind string, keys ...int) {
				t.Helper()
				tx, commit, rollback := db.Begin(t)
				for _, k := range keys {
					if _, err := store.Enqueue(ctx, tx, outbox.Event{Stream: stream, Key: secretKey(k), Kind: kind, Payload: []byte(secretPayload)}); err != nil {
						rollback()
						t.Fatal(err)
					}
				}
				if err := commit(); err != nil {
					t.Fatal(err)
				}
			}
			var printed strings.Builder
			run := func(wantCode int, args ...string) string {
				t.Helper()
				code, stdout, stderr := cli(t, nil, append(flagDB, args...)...)
				printed.WriteString(stdout + stderr)
				if code != wantCode {
					t.Fatalf("millpond %q: code %d, want %d\n%s%s", args, code, wantCode, stdout, stderr)
				}
				return stdout
			}

			// billing takes OrderPlaced; "reserve" is a renamed handler's old group.
			for _, g := range []string{"billing", "reserve"} {
				if err := store.RegisterGroup(ctx, "orders", g, "OrderPlaced"); err != nil {
					t.Fatal(err)
				}
			}
			enqueue("orders", "OrderPlaced", 1, 2, 3)
			cs, err := store.Claim(ctx, outbox.ClaimRequest{Stream: "orders", Group: "billing", Worker: "w", Limit: 10, Lease: time.Minute, MaxAttempts: 1})
			if err != nil || len(cs) != 3 {
				t.Fatalf("claim: %v, %v", cs, err)
			}
			if err := store.Acknowledge(ctx, cs[0].Receipt()); err != nil {
				t.Fatal(err)
			}
			for _, c := range cs[1:] {
				if _, err := store.Fail(ctx, c.Receipt(), outbox.Failure{Reason: "card declined", MaxAttempts: 1}); err != nil {
					t.Fatal(err)
				}
			}
			enqueue("audit", "Anything", 4) // no group: the default group

			// groups list: text and JSON.
			out := run(exitOK, "groups", "list")
			if got := row(t, out, "orders", "billing"); !slices.Equal(got[2:8], []string{"yes", "OrderPlaced", "0", "0", "2", "1"}) || got[8] == "-" || got[9] == "-" {
				t.Fatalf("billing row %q", got)
			}
			if got := row(t, out, "orders", "reserve"); !slices.Equal(got[2:8], []string{"yes", "OrderPlaced", "3", "0", "0", "0"}) || got[9] != "-" {
				t.Fatalf("reserve row %q", got)
			}
			if got := row(t, out, "audit", "(default)"); !slices.Equal(got[2:8], []string{"no", "-", "1", "0", "0", "0"}) {
				t.Fatalf("default group row %q", got)
			}
			rows := decodeJSON(t, run(exitOK, "groups", "list", "-json"), "stream", "group", "registered", "all_kinds", "kinds",
				"registered_at", "pending", "processing", "dead", "delivered", "last_enqueued_at", "last_delivered_at")
			if len(rows) != 3 {
				t.Fatalf("groups list -json: %d rows", len(rows))
			}
			def, billing, reserve := rows[0], rows[1], rows[2]
			if def["stream"] != "audit" || def["group"] != "" || def["registered"] != false || def["registered_at"] != nil ||
				def["pending"] != 1.0 || def["last_delivered_at"] != nil || fmt.Sprint(def["kinds"]) != "[]" {
				t.Errorf("default group JSON %v", def)
			}
			if billing["group"] != "billing" || billing["registered"] != true || billing["all_kinds"] != false ||
				fmt.Sprint(billing["kinds"]) != "[OrderPlaced]" || billing["dead"] != 2.0 || billing["delivered"] != 1.0 {
				t.Errorf("billing JSON %v", billing)
			}
			for _, f := range []string{"registered_at", "last_enqueued_at", "last_delivered_at"} {
				if s, ok := billing[f].(string); !ok || func() bool { _, err := time.Parse(time.RFC3339Nano, s); return err != nil }() {
					t.Errorf("billing %s = %v, want an RFC 3339 time", f, billing[f])
				}
			}
			if reserve["group"] != "reserve" || reserve["pending"] != 3.0 || reserve["last_delivered_at"] != nil {
				t.Errorf("reserve JSON %v", reserve)
			}
			if rows := decodeJSON(t, run(exitOK, "groups", "list", "-stream", "audit", "-json"), "stream", "group", "registered", "all_kinds", "kinds",
				"registered_at", "pending", "processing", "dead", "delivered", "last_enqueued_at", "last_delivered_at"); len(rows) != 1 {
				t.Errorf("groups list -stream audit: %v", rows)
			}

			// stats -json and dead list -json: the documented fields, no keys.
			st := decodeJSON(t, run(exitOK, "stats", "-json"), "stream", "group", "pending", "processing", "dead", "oldest_pending_age_ms", "retrying", "blocked", "held_keys")
			if len(st) != 3 || st[1]["group"] != "billing" || st[1]["dead"] != 2.0 || st[2]["pending"] != 3.0 {
				t.Errorf("stats -json: %v", st)
			}
			dead := decodeJSON(t, run(exitOK, "dead", "list", "-stream", "orders", "-group", "billing", "-json"),
				"id", "stream", "group", "kind", "attempts", "created_at", "last_error")
			if len(dead) != 2 || dead[0]["id"] != float64(cs[1].ID) || dead[0]["kind"] != "OrderPlaced" || dead[0]["last_error"] != "card declined" || dead[0]["attempts"] != 1.0 {
				t.Errorf("dead list -json: %v", dead)
			}
			if out := run(exitOK, "dead", "list", "-stream", "nowhere", "-json"); strings.TrimSpace(out) != "[]" {
				t.Errorf("empty dead list -json: %q", out)
			}

			// Unregistering the old group is refused while it has pending events.
			code, _, stderr := cli(t, nil, append(flagDB, "groups", "unregister", "-stream", "orders", "-group", "reserve")...)
			if code != exitFailure || !strings.Contains(stderr, "still has 3 pending and 0 processing events") || !strings.Contains(stderr, "-discard") {
				t.Fatalf("unregister with a backlog: code %d, stderr %q", code, stderr)
			}
			if regs, _ := store.RegisteredGroups(ctx, "orders"); len(regs) != 2 {
				t.Fatalf("a refused unregister changed the registrations: %v", regs)
			}
			out = run(exitOK, "groups", "unregister", "-stream", "orders", "-group", "reserve", "-discard", "-yes")
			if want := "unregistered group reserve from stream orders; discarded 3 pending, 0 processing and 0 dead-lettered events"; strings.TrimSpace(out) != want {
				t.Fatalf("unregister -discard: %q, want %q", out, want)
			}
			run(exitNothing, "groups", "unregister", "-stream", "orders", "-group", "reserve")
			// billing's only undelivered events are dead letters: it may go, they stay.
			code, stdout, stderr := cli(t, nil, append(flagDB, "groups", "unregister", "-stream", "orders", "-group", "billing")...)
			if code != exitOK || strings.TrimSpace(stdout) != "unregistered group billing from stream orders" || !strings.Contains(stderr, "its 2 dead-lettered events stay") {
				t.Fatalf("unregister billing: code %d, %q %q", code, stdout, stderr)
			}

			// dead discard: nothing matched exits 3; then by id and all.
			run(exitNothing, "dead", "discard", "-stream", "orders", "-group", "billing", "-kind", "Other")
			run(exitNothing, "dead", "discard", "-stream", "orders", fmt.Sprint(cs[0].ID))
			if out := run(exitOK, "dead", "discard", "-stream", "orders", fmt.Sprint(cs[1].ID), fmt.Sprint(cs[0].ID)); !strings.Contains(out, "discarded 1 of 2 events") {
				t.Fatalf("discard by id: %q", out)
			}
			if out := run(exitOK, "dead", "discard", "-stream", "orders", "-group", "billing", "-all", "-yes"); !strings.Contains(out, "discarded 1 dead-lettered events") {
				t.Fatalf("discard -all: %q", out)
			}
			run(exitNothing, "dead", "discard", "-stream", "orders", "-group", "billing", "-all")
			// requeue and reroute of ids that match nothing exit 3 too.
			run(exitNothing, "dead", "requeue", "-stream", "orders", fmt.Sprint(cs[1].ID))
			run(exitNothing, "dead", "reroute", "-stream", "orders", "999999")

			// pending reroute: the audit event waits in the default group until
			// a group takes its kind.
			run(exitNothing, "pending", "reroute", "-stream", "audit")
			if err := store.RegisterGroup(ctx, "audit", "archiver"); err != nil {
				t.Fatal(err)
			}
			if out := run(exitOK, "pending", "reroute", "-stream", "audit"); !strings.Contains(out, "moved 1 pending events") {
				t.Fatalf("pending reroute: %q", out)
			}
			run(exitNothing, "pending", "reroute", "-stream", "audit")
			if got := row(t, run(exitOK, "groups", "list", "-stream", "audit"), "audit", "archiver"); got[4] != "1" {
				t.Fatalf("archiver after the move: %q", got)
			}

			all := printed.String()
			for i := 1; i <= 4; i++ {
				if strings.Contains(all, secretKey(i)) {
					t.Errorf("an event key was printed:\n%s", all)
				}
			}
			if strings.Contains(all, secretPayload) {
				t.Errorf("a payload was printed:\n%s", all)
			}
		})
	}
}

// Every command and command group answers -h with its usage and exit 0.
func TestHelpOnEveryCommand(t *testing.T) {
	env := map[string]string{EnvDatabaseURL: "sqlite:" + t.TempDir() + "/never-opened.db"}
	for _, args := range [][]string{
		{"-h"}, {"help"}, {"migrate"}, {"stats"}, {"purge"},
		{"dead"}, {"dead", "list"}, {"dead", "requeue"}, {"dead", "reroute"}, {"dead", "discard"},
		{"groups"}, {"groups", "list"}, {"groups", "unregister"},
		{"pending"}, {"pending", "reroute"},
	} {
		for _, h := range []string{"-h", "-help", "--help"} {
			a := append(slices.Clone(args), h)
			if args[0] == "-h" || args[0] == "help" {
				a = args
			}
			code, stdout, stderr := cli(t, env, a...)
			if code != exitOK || !strings.Contains(stdout+stderr, "Usage: millpond") {
				t.Errorf("millpond %q: code %d, output %q; want 0 and the usage", a, code, stdout+stderr)
			}
		}
	}
	for _, args := range [][]string{
		{"groups"}, {"groups", "drop"}, {"pending"}, {"pending", "flush"},
		{"groups", "list", "extra"}, {"groups", "list", "-stream", "bad stream"},
		{"groups", "unregister", "-stream", "s"}, {"groups", "unregister", "-group", "g"},
		{"groups", "unregister", "-stream", "s", "-group", "bad group"}, {"groups", "unregister", "-stream", "s", "-group", "g", "extra"},
		{"dead", "discard"}, {"dead", "discard", "-stream", "s"}, {"dead", "discard", "-all"},
		{"dead", "discard", "-stream", "s", "1", "-all"}, {"dead", "discard", "-stream", "s", "-kind", "K", "-all"},
		{"dead", "discard", "-stream", "s", "-group", "g", "1"}, {"dead", "discard", "-stream", "s", "zero"},
		{"dead", "discard", "-stream", "s", "-kind", "bad kind"}, {"dead", "discard", "-stream", "bad stream", "1"},
		{"dead", "requeue", "-stream", "bad stream", "1"}, {"dead", "list", "-stream", "s", "-group", "bad group"},
		{"pending", "reroute"}, {"pending", "reroute", "-stream", "s", "extra"},
		{"stats", "-json=maybe"},
	} {
		if code, _, stderr := cli(t, env, args...); code != exitUsage || stderr == "" {
			t.Errorf("millpond %q: code %d, stderr %q; want %d and a message", args, code, stderr, exitUsage)
		}
	}
}
