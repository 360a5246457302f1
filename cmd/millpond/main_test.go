package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/millpond/millpond/dsn"
	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// cli runs the command in-process and returns its exit code and output.
func cli(t *testing.T, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(context.Background(), args, &out, &errb, func(k string) string { return env[k] })
	t.Logf("millpond %s -> %d\n%s%s", strings.Join(redactArgs(args), " "), code, out.String(), errb.String())
	return code, out.String(), errb.String()
}

func redactArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = a
		if i > 0 && strings.TrimLeft(args[i-1], "-") == "db" || strings.ContainsAny(a, ":=@") {
			out[i] = dsn.Redact(a)
		}
	}
	return out
}

// row finds the table row whose first cells are prefix and returns its cells.
func row(t *testing.T, table string, prefix ...string) []string {
	t.Helper()
	for _, line := range strings.Split(table, "\n") {
		cells := strings.Fields(line)
		if len(cells) >= len(prefix) && slicesEqual(cells[:len(prefix)], prefix) {
			return cells
		}
	}
	t.Fatalf("no row starting %q in\n%s", prefix, table)
	return nil
}

func slicesEqual(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestAdminCommand(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			db := testdb.New(t, dialect)
			ctx := context.Background()
			flagDB := []string{"-db", db.URL}

			// migrate, twice: idempotent; the first says what it applied.
			for i, want := range []string{"applied migration", "up to date"} {
				code, out, _ := cli(t, nil, append(flagDB, "migrate")...)
				if code != 0 || !strings.Contains(out, want) {
					t.Fatalf("migrate #%d: code %d, output %q; want %q", i+1, code, out, want)
				}
			}

			// Enqueue 4 events through the Store; deliver 3, dead-letter 1.
			store := db.Store(t)
			tx, commit, rollback := db.Begin(t)
			for i := range 4 {
				ev := outbox.Event{Stream: "orders", Key: fmt.Sprintf("order-%d", i), Kind: "OrderPlaced", Payload: []byte(`{}`)}
				if _, err := store.Enqueue(ctx, tx, ev); err != nil {
					rollback()
					t.Fatal(err)
				}
			}
			if err := commit(); err != nil {
				t.Fatal(err)
			}
			claimed, err := store.Claim(ctx, outbox.ClaimRequest{Stream: "orders", Worker: "cli-test", Limit: 10, Lease: time.Minute, MaxAttempts: 1})
			if err != nil || len(claimed) != 4 {
				t.Fatalf("claim: %d events, %v", len(claimed), err)
			}
			deadID := claimed[3].ID
			out, err := store.Fail(ctx, claimed[3].Receipt(), outbox.Failure{Reason: "payment service said no", MaxAttempts: 1})
			if err != nil || !out.DeadLettered {
				t.Fatalf("fail: %+v, %v", out, err)
			}
			if stale, err := store.AcknowledgeBatch(ctx, []outbox.Receipt{claimed[0].Receipt(), claimed[1].Receipt(), claimed[2].Receipt()}); err != nil || len(stale) > 0 {
				t.Fatalf("ack: %d stale, %v", len(stale), err)
			}

			// The database may also come from the environment.
			env := map[string]string{EnvDatabaseURL: db.URL}
			code, stdout, _ := cli(t, env, "stats")
			if code != 0 {
				t.Fatalf("stats: code %d", code)
			}
			if got := row(t, stdout, "orders", "(default)"); len(got) != 9 || got[2] != "0" || got[3] != "0" || got[4] != "1" || got[6] != "0" || got[7] != "0" || got[8] != "0" {
				t.Fatalf("stats row %q: want 0 pending, 0 processing, 1 dead, 0 blocked, 0 held keys, 0 retrying", got)
			}
			if !strings.Contains(stdout, "BLOCKED") || !strings.Contains(stdout, "HELD_KEYS") {
				t.Fatalf("stats header lacks the ordering columns: %q", stdout)
			}

			code, stdout, _ = cli(t, nil, append(flagDB, "dead", "list", "-stream", "orders")...)
			if code != 0 {
				t.Fatalf("dead list: code %d", code)
			}
			got := row(t, stdout, fmt.Sprint(deadID))
			if got[1] != "(default)" || got[2] != "(hidden)" || strings.Contains(stdout, "order-3") || got[3] != "OrderPlaced" || got[4] != "1" || !strings.Contains(stdout, "payment service said no") {
				t.Fatalf("dead list row %q", got)
			}
			if n := strings.Count(strings.TrimSpace(stdout), "\n"); n != 1 {
				t.Fatalf("dead list: want a header and one row, got %d rows", n)
			}
			// Paging past the last id and another group list nothing.
			for _, args := range [][]string{{"-after", fmt.Sprint(deadID)}, {"-group", "billing"}} {
				code, stdout, _ = cli(t, nil, append(append(flagDB, "dead", "list", "-stream", "orders"), args...)...)
				if code != 0 || strings.Count(strings.TrimSpace(stdout), "\n") != 0 {
					t.Fatalf("dead list %v: code %d, output %q", args, code, stdout)
				}
			}
			code, stdout, _ = cli(t, nil, append(flagDB, "dead", "list", "-stream", "orders", "-all-groups", "-limit", "1", "-show-keys")...)
			if code != 0 || !strings.Contains(stdout, "order-3") {
				t.Fatalf("dead list -all-groups: code %d, output %q", code, stdout)
			}

			// Requeue it (ids after the flags, and a repeat that is not dead).
			code, stdout, _ = cli(t, nil, append(flagDB, "dead", "requeue", "-stream", "orders", fmt.Sprint(deadID), fmt.Sprint(claimed[0].ID))...)
			if code != 0 || !strings.Contains(stdout, "requeued 1 of 2 events") {
				t.Fatalf("dead requeue: code %d, output %q", code, stdout)
			}
			code, stdout, _ = cli(t, nil, append(flagDB, "stats")...)
			if got := row(t, stdout, "orders", "(default)"); code != 0 || got[2] != "1" || got[4] != "0" {
				t.Fatalf("stats after requeue: code %d, row %q: want 1 pending, 0 dead", code, got)
			}
			again, err := store.Claim(ctx, outbox.ClaimRequest{Stream: "orders", Worker: "cli-test", Limit: 10, Lease: time.Minute, MaxAttempts: 1})
			if err != nil || len(again) != 1 || again[0].ID != deadID || again[0].Attempts != 1 {
				t.Fatalf("claim after requeue: %v, %v", again, err)
			}

			// Purge: a long horizon keeps everything, zero deletes the 3 delivered.
			code, stdout, _ = cli(t, nil, append(flagDB, "purge", "-older-than", "7d")...)
			if code != 0 || !strings.Contains(stdout, "purged 0 ") {
				t.Fatalf("purge 7d: code %d, output %q", code, stdout)
			}
			time.Sleep(5 * time.Millisecond) // delivered_at is strictly in the past
			code, stdout, _ = cli(t, nil, append(flagDB, "purge", "-older-than", "0s", "-limit", "2", "-yes")...)
			if code != 0 || !strings.Contains(stdout, "purged 2 ") {
				t.Fatalf("purge -limit 2: code %d, output %q", code, stdout)
			}
			code, stdout, _ = cli(t, nil, append(flagDB, "purge", "-older-than", "0s", "-yes")...)
			if code != 0 || !strings.Contains(stdout, "purged 1 ") {
				t.Fatalf("purge: code %d, output %q", code, stdout)
			}
			if n := db.Count(t, "SELECT COUNT(*) FROM millpond_outbox"); n != 1 {
				t.Fatalf("%d rows left after purge, want the 1 processing event", n)
			}

			// migrate -down removes the schema; stats then fails with code 1.
			if code, _, _ := cli(t, nil, append(flagDB, "migrate", "-down")...); code != 2 {
				t.Fatalf("migrate -down without -yes: code %d, want the usage error 2", code)
			}
			code, stdout, _ = cli(t, nil, append(flagDB, "migrate", "-down", "-yes")...)
			if code != 0 || !strings.Contains(stdout, "removed") {
				t.Fatalf("migrate -down: code %d, output %q", code, stdout)
			}
			if code, _, stderr := cli(t, nil, append(flagDB, "stats")...); code != 1 || !strings.Contains(stderr, "the outbox schema is not installed") {
				t.Fatalf("stats without schema: code %d, stderr %q; want 1 and the hint", code, stderr)
			}
		})
	}
}

func TestUsageErrors(t *testing.T) {
	env := map[string]string{EnvDatabaseURL: "sqlite:" + t.TempDir() + "/never-opened.db"}
	cases := [][]string{
		{},
		{"frobnicate"},
		{"-nope", "stats"},
		{"stats", "extra"},
		{"dead"},
		{"dead", "bury"},
		{"dead", "list"},
		{"dead", "list", "-stream", "s", "-group", "g", "-all-groups"},
		{"dead", "list", "-stream", "s", "-limit", "0"},
		{"dead", "list", "-stream", "s", "-limit", "1001"},
		{"dead", "list", "-stream", "s", "-after", "-1"},
		{"dead", "list", "-stream", "s", "-json", "-show-keys"},
		{"dead", "list", "-stream", "bad stream"},
		{"dead", "requeue", "-stream", "s"},
		{"dead", "requeue", "1"},
		{"dead", "requeue", "-stream", "s", "one"},
		{"dead", "requeue", "-stream", "s", "0"},
		{"purge"},
		{"purge", "-older-than", "-1h"},
		{"purge", "-older-than", "soon"},
		{"purge", "-older-than", "7x"},
		{"purge", "-older-than", "d"},
		{"purge", "-older-than", "1d-1h"},
		{"purge", "-older-than", "1h", "-limit", "-5"},
		{"migrate", "-down=maybe"},
		{"migrate", "-lock-timeout", "0s"},
		{"migrate", "-lock-timeout", "soon"},
	}
	for _, args := range cases {
		if code, _, stderr := cli(t, env, args...); code != exitUsage || stderr == "" {
			t.Errorf("millpond %q: code %d, stderr %q; want %d and a message", args, code, stderr, exitUsage)
		}
	}
	if code, _, _ := cli(t, nil, "stats"); code != exitUsage {
		t.Errorf("stats without a database: code %d, want %d", code, exitUsage)
	}
	for _, args := range [][]string{{"-h"}, {"help"}, {"purge", "-h"}} {
		if code, _, _ := cli(t, env, args...); code != exitOK {
			t.Errorf("millpond %q: code %d, want 0", args, code)
		}
	}
}

func TestPasswordsNeverPrinted(t *testing.T) {
	const secret = "hunter2-S3cret"
	cases := []struct {
		addr string
		code int
		// shown is what the error or output names instead of the address.
		shown string
	}{
		{"postgres://admin:" + secret + "@127.0.0.1:1/db?sslmode=disable&connect_timeout=2", exitFailure, "postgres://admin:xxxxx@"},
		{"postgres://admin@127.0.0.1:1/db?sslmode=disable&connect_timeout=2&password=" + secret, exitFailure, "password=xxxxx"},
		{"mysql://admin:" + secret + "@127.0.0.1:1/db", exitFailure, "mysql://admin:xxxxx@"},
		{"postgres://admin:" + secret + "@127.0.0.1:1/db?sslmode=bogus", exitFailure, "postgres://admin:xxxxx@"}, // a parse error
		{"host=127.0.0.1 port=1 user=admin password=" + secret + " dbname=test connect_timeout=2", exitFailure, "password=xxxxx"},
		{"host=127.0.0.1 port=1 user=admin password='" + secret + " x' dbname=test", exitFailure, "password=xxxxx"},
		{"admin:" + secret + "@tcp(127.0.0.1:1)/db", exitUsage, "mysql://user:pass@host:3306/db"},
		{"postgress://admin:" + secret + "@127.0.0.1/db", exitUsage, `unknown scheme "postgress"`},
		{secret, exitUsage, "postgres://"},
		// A password with an unencoded '#', '/' or '?' (the URL's
		// authority would end inside it) is refused before connecting.
		{"postgres://admin:12#" + secret + "@127.0.0.1:1/db", exitUsage, "percent-encode"},
		{"mysql://admin:/" + secret + "@127.0.0.1:1/db", exitUsage, "percent-encode"},
	}
	for _, c := range cases {
		for _, args := range [][]string{{"-db", c.addr, "stats"}, {"stats", "-db", c.addr}, {"migrate", "-db", c.addr}} {
			code, stdout, stderr := cli(t, nil, args...)
			if code != c.code {
				t.Errorf("%s: code %d, want %d", dsn.Redact(c.addr), code, c.code)
			}
			if strings.Contains(stdout+stderr, secret) {
				t.Errorf("%s: output shows the password:\n%s%s", dsn.Redact(c.addr), stdout, stderr)
			}
			if !strings.Contains(stderr, c.shown) {
				t.Errorf("%s: error does not say %q: %q", dsn.Redact(c.addr), c.shown, stderr)
			}
		}
		if code, stdout, stderr := cli(t, map[string]string{EnvDatabaseURL: c.addr}, "stats"); code != c.code || strings.Contains(stdout+stderr, secret) {
			t.Errorf("%s from the environment: code %d, output %q%q", dsn.Redact(c.addr), code, stdout, stderr)
		}
	}
}

// A password in a working address (PostgreSQL's trust authentication
// ignores it) stays out of the output of commands that succeed too.
func TestPasswordNeverPrintedOnSuccess(t *testing.T) {
	const secret = "Tr0ub4dor-unique-9f3"
	db := testdb.New(t, "postgres")
	withPassword, kv := db.WithPassword(t, secret)
	for _, addr := range []string{kv, withPassword} {
		for _, args := range [][]string{{"migrate"}, {"stats"}, {"dead", "list", "-stream", "orders"}} {
			code, stdout, stderr := cli(t, nil, append(args, "-db", addr)...)
			if code != exitOK {
				t.Fatalf("%q on %s: code %d: %s", args, dsn.Redact(addr), code, stderr)
			}
			if strings.Contains(stdout+stderr, secret) {
				t.Errorf("%q: output shows the password:\n%s%s", args, stdout, stderr)
			}
		}
	}
}

// millpond relay shows neither the database's nor the NATS server's
// password: not when the database cannot be reached, not when it opens and
// NATS cannot be reached.
func TestRelayNeverPrintsPasswords(t *testing.T) {
	const dbSecret, natsSecret = "relay-Db-Pw-7781", "relay-Nats-Pw-3390"
	db := testdb.New(t, "postgres")
	withPassword, kv := db.WithPassword(t, dbSecret)
	nats := "nats://relayuser:" + natsSecret + "@127.0.0.1:1"
	for _, addr := range []string{
		withPassword, kv,
		"postgres://admin:" + dbSecret + "@127.0.0.1:1/db?connect_timeout=2",
	} {
		code, stdout, stderr := cli(t, nil, "relay", "-db", addr, "-nats", nats, "-stream", "orders", "-subject-prefix", "events")
		if code == exitOK {
			t.Errorf("%s: relay ran with an unreachable NATS server", dsn.Redact(addr))
		}
		if out := stdout + stderr; strings.Contains(out, dbSecret) || strings.Contains(out, natsSecret) {
			t.Errorf("%s: output shows a password:\n%s", dsn.Redact(addr), out)
		}
		if stderr == "" {
			t.Errorf("%s: relay failed without a word", dsn.Redact(addr))
		}
	}
	// A password that is not percent-encoded makes the URL unparseable;
	// nats.go's parse error would quote it whole.
	const raw = "Nats%Pw-5521"
	code, stdout, stderr := cli(t, nil, "relay", "-db", withPassword, "-nats", "nats://relayuser:"+raw+"@127.0.0.1:4222",
		"-stream", "orders", "-subject-prefix", "events")
	if out := stdout + stderr; code == exitOK || strings.Contains(out, raw) || !strings.Contains(out, "does not parse") {
		t.Errorf("unparseable NATS URL: exit %d, output:\n%s", code, out)
	}
}

// TestStatsShowsRetrying: the stats table has the RETRYING column that
// -json has as retrying: pending events that failed at least once.
func TestStatsShowsRetrying(t *testing.T) {
	ctx := context.Background()
	db := testdb.New(t, "sqlite")
	store := db.Store(t)
	tx, commit, _ := db.Begin(t)
	for _, k := range []string{"a", "b"} {
		if _, err := store.Enqueue(ctx, tx, outbox.Event{Stream: "s", Key: k, Kind: "K", Payload: []byte("{}")}); err != nil {
			t.Fatal(err)
		}
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}
	cs, err := store.Claim(ctx, outbox.ClaimRequest{Stream: "s", Worker: "w", Limit: 1, Lease: time.Minute, MaxAttempts: 3})
	if err != nil || len(cs) != 1 {
		t.Fatalf("claim: %d, %v", len(cs), err)
	}
	if _, err := store.Fail(ctx, cs[0].Receipt(), outbox.Failure{Reason: "later", MaxAttempts: 3, RetryDelay: time.Hour}); err != nil {
		t.Fatal(err)
	}
	code, stdout, _ := cli(t, nil, "-db", db.URL, "stats")
	if code != 0 {
		t.Fatalf("stats: code %d", code)
	}
	if !strings.Contains(stdout, "RETRYING") {
		t.Fatalf("stats header lacks RETRYING: %q", stdout)
	}
	if got := row(t, stdout, "s", "(default)"); len(got) != 9 || got[2] != "2" || got[8] != "1" {
		t.Fatalf("stats row %q: want 2 pending, 1 of them retrying", got)
	}
}

// TestUsageTellsToKeepPasswordsOffTheCommandLine: -db and -nats are seen by
// every user of the machine in the process list; the help of the tool and
// of relay names the environment variables to use instead.
func TestUsageTellsToKeepPasswordsOffTheCommandLine(t *testing.T) {
	for _, c := range []struct {
		args []string
		vars []string
	}{
		{[]string{"-h"}, []string{EnvDatabaseURL}},
		{[]string{"relay", "-h"}, []string{EnvDatabaseURL, EnvNATSURL}},
	} {
		code, stdout, stderr := cli(t, nil, c.args...)
		help := stdout + stderr
		if code != exitOK || !strings.Contains(help, "process list") {
			t.Errorf("millpond %q: code %d; the help does not warn about the process list:\n%s", c.args, code, help)
		}
		for _, v := range c.vars {
			if !strings.Contains(help, "set $"+v) && !strings.Contains(help, "$"+v+" instead") && !strings.Contains(help, "$"+v+" and") {
				t.Errorf("millpond %q: the help does not name $%s as the way:\n%s", c.args, v, help)
			}
		}
	}
}
