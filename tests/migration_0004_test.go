package tests

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
	mysqlstore "github.com/millpond/millpond/outbox/mysql"
	"github.com/millpond/millpond/outbox/postgres"
	"github.com/millpond/millpond/outbox/sqlite"
)

// Migration 0004 moves each event's content into millpond_events and the
// per-group state into millpond_deliveries. This test writes rows in every
// state with the SQL of the 0003 layout, migrates with Store.Migrate and
// checks through the public API that nothing was lost; it also checks that
// the millpond_outbox view shows every row as written, and that the down
// step gives back the 0003 table with every row and column.

// v4Base is the fake clock's start (microseconds since the epoch).
const v4Base = int64(1_700_000_000_000_000)

const minute = int64(60_000_000)

// v3Row is a millpond_outbox row of the 0003 layout.
type v3Row struct {
	group, key, kind, status, claimedBy, claimKey, lastError, orderingKey string
	payload                                                               []byte
	metadata                                                              string
	attempts                                                              int
	availableAt, createdAt                                                int64
	deliveredAt                                                           int64 // 0: NULL
	orderingSeq                                                           int64
	keyReleased                                                           bool
	stream                                                                string
}

// v4Rows are the rows written before the migration: every state, several
// groups of one event, ordering keys blocked, held and released, metadata.
func v4Rows() []v3Row {
	md := `{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","ü":"✓ \"quoted\""}`
	bin := []byte{0, 1, 2, 0xff, 'x'}
	T := v4Base
	r := func(group, key, status string) v3Row {
		return v3Row{stream: "m4", group: group, key: key, kind: "Placed", status: status, metadata: "{}",
			payload: []byte("payload of " + key), availableAt: T, createdAt: T - 5*minute}
	}
	var rows []v3Row
	// e1: pending in two groups, with metadata and a binary payload.
	for _, g := range []string{"billing", "shipping"} {
		x := r(g, "e1", "pending")
		x.payload, x.metadata = bin, md
		rows = append(rows, x)
	}
	// e2: processing under a live lease in billing, delivered in shipping.
	x := r("billing", "e2", "processing")
	x.attempts, x.claimedBy, x.claimKey, x.availableAt = 1, "w-old", "0123456789abcdef0123456789abcdef", T+60*minute
	rows = append(rows, x)
	x = r("shipping", "e2", "delivered")
	x.attempts, x.claimedBy, x.deliveredAt, x.availableAt = 1, "w-old", T-10*minute, T-11*minute
	rows = append(rows, x)
	// e3: retrying (pending, attempts, last error, due in 30 minutes).
	x = r("billing", "e3", "pending")
	x.attempts, x.lastError, x.availableAt, x.claimedBy = 2, "boom: upstream 503", T+30*minute, "w-old"
	rows = append(rows, x)
	// e4: dead letter.
	x = r("billing", "e4", "dead_letter")
	x.attempts, x.lastError, x.kind = 5, "gave up", "Refunded"
	rows = append(rows, x)
	// e5: delivered two hours ago.
	x = r("billing", "e5", "delivered")
	x.attempts, x.deliveredAt = 1, T-120*minute
	rows = append(rows, x)
	// k1: a head and two blocked events behind it.
	for i, st := range []string{"pending", "blocked", "blocked"} {
		x = r("billing", "e"+strconv.Itoa(6+i), st)
		x.orderingKey, x.orderingSeq = "k1", int64(i+1)
		rows = append(rows, x)
	}
	// k2: held by a dead letter, one event blocked behind it.
	x = r("billing", "e9", "dead_letter")
	x.orderingKey, x.orderingSeq, x.attempts, x.lastError = "k2", 1, 5, "poison"
	rows = append(rows, x)
	x = r("billing", "e10", "blocked")
	x.orderingKey, x.orderingSeq = "k2", 2
	rows = append(rows, x)
	// k3: released by a dead letter (DeadLetterSkip), its next event pending.
	x = r("billing", "e11", "dead_letter")
	x.orderingKey, x.orderingSeq, x.attempts, x.lastError, x.keyReleased = "k3", 1, 5, "skipped", true
	rows = append(rows, x)
	x = r("billing", "e12", "pending")
	x.orderingKey, x.orderingSeq = "k3", 2
	rows = append(rows, x)
	// e13: a lease that expired (reclaimed by the next claim).
	x = r("billing", "e13", "processing")
	x.attempts, x.claimedBy, x.claimKey, x.availableAt = 1, "w-dead", "fedcba9876543210fedcba9876543210", T-minute
	rows = append(rows, x)
	// e14: waiting in the default group of another stream for a kind no
	// group took when it was enqueued.
	x = r("", "e14", "pending")
	x.stream, x.kind = "m4d", "Late"
	rows = append(rows, x)
	return rows
}

// contentHashOf is Store.Enqueue's content hash (internal/sqlcore).
func contentHashOf(kind string, payload []byte, orderingKey string) []byte {
	h := sha256.New()
	if orderingKey != "" {
		h.Write([]byte(orderingKey))
		h.Write([]byte{1})
	}
	h.Write([]byte(kind))
	h.Write([]byte{0})
	h.Write(payload)
	return h.Sum(nil)
}

// rebind turns ? placeholders into PostgreSQL's $n.
func rebind(dialect, q string) string {
	if dialect != "postgres" {
		return q
	}
	var b strings.Builder
	n := 0
	for _, c := range q {
		if c == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(c)
	}
	return b.String()
}

// migrationScript runs one golang-migrate file of outbox.MigrationsFS the
// way Store.Migrate does (PostgreSQL: the whole file; others: statement by
// statement).
func migrationScript(t *testing.T, db *sql.DB, dialect, name string) {
	t.Helper()
	fsys, err := outbox.MigrationsFS(dialect)
	if err != nil {
		t.Fatal(err)
	}
	body, err := fs.ReadFile(fsys, name)
	if err != nil {
		t.Fatal(err)
	}
	stmts := []string{string(body)}
	if dialect != "postgres" {
		stmts = nil
		for _, part := range strings.Split(string(body), ";\n") {
			if s := strings.TrimSpace(part); s != "" {
				stmts = append(stmts, s)
			}
		}
	}
	for _, s := range stmts {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
}

// installVersion3 applies migrations 1-3 from the plain files and records
// them as Store.Migrate would have.
func installVersion3(t *testing.T, db *sql.DB, dialect string) {
	t.Helper()
	fsys, err := outbox.MigrationsFS(dialect)
	if err != nil {
		t.Fatal(err)
	}
	names, err := fs.Glob(fsys, "*.up.sql")
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	ddl := map[string]string{
		"postgres": "CREATE TABLE millpond_schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR(128) NOT NULL, applied_at BIGINT NOT NULL)",
		"mysql":    "CREATE TABLE millpond_schema_migrations (version INT PRIMARY KEY, name VARCHAR(128) NOT NULL, applied_at BIGINT NOT NULL) ENGINE=InnoDB",
		"sqlite":   "CREATE TABLE millpond_schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)",
	}[dialect]
	if _, err := db.Exec(ddl); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		num, rest, _ := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if err != nil {
			t.Fatal(err)
		}
		if v > 3 {
			continue
		}
		migrationScript(t, db, dialect, name)
		if _, err := db.Exec(rebind(dialect, "INSERT INTO millpond_schema_migrations (version, name, applied_at) VALUES (?, ?, ?)"),
			v, strings.TrimSuffix(rest, ".up.sql"), v4Base); err != nil {
			t.Fatal(err)
		}
	}
}

// writeVersion3 writes the rows, key states and subscriptions with the SQL
// of the 0003 layout.
func writeVersion3(t *testing.T, db *sql.DB, dialect string, rows []v3Row) {
	t.Helper()
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.Exec(rebind(dialect, q), args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for _, g := range []string{"billing", "shipping"} {
		exec("INSERT INTO millpond_subscriptions (stream, consumer_group, event_kind, created_at) VALUES ('m4', ?, '', ?)", g, v4Base-60*minute)
	}
	for _, r := range rows {
		var delivered any
		if r.deliveredAt != 0 {
			delivered = r.deliveredAt
		}
		cols := "stream, consumer_group, event_key, event_kind, payload, metadata, content_hash, status, attempts, claimed_by, claim_key, available_at, created_at, delivered_at, last_error, ordering_key, ordering_seq, key_released"
		vals := "?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?"
		args := []any{r.stream, r.group, r.key, r.kind, r.payload, r.metadata, contentHashOf(r.kind, r.payload, r.orderingKey), r.status, r.attempts,
			r.claimedBy, r.claimKey, r.availableAt, r.createdAt, delivered, r.lastError, r.orderingKey, r.orderingSeq, r.keyReleased}
		if dialect == "postgres" {
			cols += ", settled"
			vals += ", ?"
			args = append(args, r.status == "delivered" || r.status == "dead_letter" || r.status == "blocked")
		}
		exec("INSERT INTO millpond_outbox ("+cols+") VALUES ("+vals+")", args...)
	}
	for _, k := range []struct {
		key             string
		last, unsettled int
	}{{"k1", 3, 3}, {"k2", 2, 2}, {"k3", 2, 1}} {
		exec("INSERT INTO millpond_ordering (stream, consumer_group, ordering_key, last_seq, unsettled) VALUES ('m4', 'billing', ?, ?, ?)", k.key, k.last, k.unsettled)
	}
}

// dumpOutbox reads every millpond_outbox row (table or view) with the 0003
// columns, one formatted line per row, in id order.
func dumpOutbox(t *testing.T, db *sql.DB, dialect string) []string {
	t.Helper()
	return dumpQuery(t, db, dumpOutboxQuery(dialect))
}

// dumpOutboxQuery is dumpOutbox's query.
func dumpOutboxQuery(dialect string) string {
	cols := "id, stream, consumer_group, event_key, event_kind, payload, metadata, content_hash, status, attempts, claimed_by, claim_key, available_at, created_at, delivered_at, last_error, ordering_key, ordering_seq, key_released"
	if dialect == "postgres" {
		cols += ", settled"
	}
	return "SELECT " + cols + " FROM millpond_outbox ORDER BY id"
}

func dumpQuery(t *testing.T, db *sql.DB, q string) []string {
	t.Helper()
	rows, err := db.Query(q)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	defer rows.Close()
	n := len(must(rows.Columns()))
	var out []string
	for rows.Next() {
		vals := make([]any, n)
		ptrs := make([]any, n)
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for i, v := range vals {
			if i > 0 {
				b.WriteString(" | ")
			}
			switch v := v.(type) {
			case []byte:
				fmt.Fprintf(&b, "%x", v)
			case nil:
				b.WriteString("NULL")
			case bool: // PostgreSQL booleans; MySQL and SQLite store 0 and 1
				if v {
					b.WriteString("1")
				} else {
					b.WriteString("0")
				}
			default:
				fmt.Fprint(&b, v)
			}
		}
		out = append(out, b.String())
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func compareDumps(t *testing.T, what string, got, want []string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d rows, want %d:\n%s", what, len(got), len(want), strings.Join(got, "\n"))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("%s: row %d is\n  %s\nwant\n  %s", what, i+1, got[i], want[i])
		}
	}
}

// TestMigration0004KeepsEveryRow writes a version-3 schema in every state,
// migrates it to version 4 with Store.Migrate, checks the view and the way
// back down, then works every row through the public API.
func TestMigration0004KeepsEveryRow(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.New(t, dialect)
			var clock atomic.Int64
			clock.Store(v4Base)
			opt := outbox.WithClock(func() time.Time { return time.UnixMicro(clock.Load()) })
			var s *outbox.Store
			var err error
			switch dialect {
			case "postgres":
				s, err = postgres.New(db.Pool, outbox.WithoutListen(), opt)
			case "mysql":
				s, err = mysqlstore.New(db.SQL, opt)
			default:
				s, err = sqlite.New(db.SQL, opt)
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			sdb := s.SQLDB()
			installVersion3(t, sdb, dialect)
			rows := v4Rows()
			writeVersion3(t, sdb, dialect, rows)
			written := dumpOutbox(t, sdb, dialect)
			if len(written) != len(rows) {
				t.Fatalf("wrote %d rows, read %d", len(rows), len(written))
			}
			ordering := "SELECT stream, consumer_group, ordering_key, last_seq, unsettled FROM millpond_ordering ORDER BY ordering_key"
			keysBefore := dumpQuery(t, sdb, ordering)

			migrate := func() {
				t.Helper()
				res, err := s.MigrateReport(ctx)
				if err != nil {
					t.Fatalf("migrate: %v", err)
				}
				// MySQL has versions 5 (indexes off status) and 7 (the
				// phase index) too.
				want := []int{4}
				if dialect == "mysql" {
					want = append(want, 5, 7)
				}
				var got []int
				for _, m := range res.Applied {
					got = append(got, m.Version)
				}
				if !slices.Equal(got, want) || res.Version != want[len(want)-1] {
					t.Fatalf("migrate applied %v, version %d; want %v", got, res.Version, want)
				}
			}
			migrate()
			// The view shows every row as the 0003 table held it.
			compareDumps(t, "millpond_outbox view after up", dumpOutbox(t, sdb, dialect), written)
			if n := db.Count(t, "SELECT COUNT(*) FROM millpond_events"); n != int64(len(rows)-2) {
				t.Errorf("%d events, want %d (e1 and e2 are in two groups)", n, len(rows)-2)
			}
			if dialect == "mysql" {
				// 0007 gave every row its phase; running it again is a
				// no-op, and down again to version 5 (twice) drops it:
				// every row as written throughout.
				phases := "SELECT status, phase, COUNT(*) FROM millpond_deliveries GROUP BY status, phase ORDER BY status, phase"
				var want []string // dumpQuery shows the status as hex
				for _, p := range []struct {
					status string
					phase  int
					n      int
				}{{"blocked", 2, 3}, {"dead_letter", 3, 3}, {"delivered", 4, 2}, {"pending", 1, 6}, {"processing", 1, 2}} {
					want = append(want, fmt.Sprintf("%x | %d | %d", p.status, p.phase, p.n))
				}
				compareDumps(t, "phases after 0007", dumpQuery(t, sdb, phases), want)
				migrationScript(t, sdb, dialect, "0007_claim_keeps_index.up.sql")
				compareDumps(t, "millpond_outbox view after 0007 again", dumpOutbox(t, sdb, dialect), written)
				compareDumps(t, "phases after 0007 again", dumpQuery(t, sdb, phases), want)
				migrationScript(t, sdb, dialect, "0007_claim_keeps_index.down.sql")
				migrationScript(t, sdb, dialect, "0007_claim_keeps_index.down.sql")
				if _, err := sdb.Exec("DELETE FROM millpond_schema_migrations WHERE version = 7"); err != nil {
					t.Fatal(err)
				}
				if n := db.Count(t, "SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_deliveries' AND COLUMN_NAME = 'phase'"); n != 0 {
					t.Errorf("phase is still there after 0007 down")
				}
				compareDumps(t, "millpond_outbox view after 0007 down", dumpOutbox(t, sdb, dialect), written)
				// 0005 runs again as a no-op, and down again to version 4
				// (twice) keeps every row.
				migrationScript(t, sdb, dialect, "0005_status_off_indexes.up.sql")
				compareDumps(t, "millpond_outbox view after 0005 again", dumpOutbox(t, sdb, dialect), written)
				if n := db.Count(t, "SELECT COUNT(*) FROM millpond_deliveries WHERE blocked_seq IS NOT NULL"); n != db.Count(t, "SELECT COUNT(*) FROM millpond_deliveries WHERE status = 'blocked'") || n == 0 {
					t.Errorf("%d rows have a blocked_seq; want every blocked row's", n)
				}
				migrationScript(t, sdb, dialect, "0005_status_off_indexes.down.sql")
				migrationScript(t, sdb, dialect, "0005_status_off_indexes.down.sql")
				if _, err := sdb.Exec("DELETE FROM millpond_schema_migrations WHERE version = 5"); err != nil {
					t.Fatal(err)
				}
				compareDumps(t, "millpond_outbox view after 0005 down", dumpOutbox(t, sdb, dialect), written)
			}

			// Down to 3: the table again, every row and column as written.
			migrationScript(t, sdb, dialect, "0004_shared_events.down.sql")
			if _, err := sdb.Exec("DELETE FROM millpond_schema_migrations WHERE version = 4"); err != nil {
				t.Fatal(err)
			}
			compareDumps(t, "millpond_outbox table after down", dumpOutbox(t, sdb, dialect), written)
			compareDumps(t, "millpond_ordering after down", dumpQuery(t, sdb, ordering), keysBefore)
			// An id handed out after the round trip is above every old one.
			migrate()
			checkAfterMigration(t, ctx, s, db, &clock, rows)
		})
	}
}

// checkAfterMigration works every migrated row through the public API.
func checkAfterMigration(t *testing.T, ctx context.Context, s *outbox.Store, db *testdb.Database, clock *atomic.Int64, rows []v3Row) {
	byKey := map[string]v3Row{}
	for _, r := range rows {
		if r.group != "shipping" {
			byKey[r.key] = r
		}
	}
	ids := map[string]int64{} // billing (or default group) row of each key
	for _, r := range rows {
		found, err := s.FindEvents(ctx, outbox.EventQuery{Stream: r.stream, Key: r.key})
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range found {
			if f.Group == r.group {
				if r.group != "shipping" {
					ids[r.key] = f.ID
				}
				if string(f.Payload) != string(r.payload) || f.Kind != r.kind || f.Status != r.status || f.Attempts != r.attempts ||
					f.LastError != r.lastError || f.CreatedAt.UnixMicro() != r.createdAt || f.AvailableAt.UnixMicro() != r.availableAt {
					t.Errorf("FindEvents %s/%s: %+v", r.group, r.key, f)
				}
			}
		}
	}

	stats := func() map[string]outbox.StreamStats {
		t.Helper()
		st, err := s.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]outbox.StreamStats{}
		for _, x := range st {
			out[x.Stream+"/"+x.Group] = x
		}
		return out
	}
	b := stats()["m4/billing"]
	if b.Pending != 4 || b.Processing != 2 || b.Dead != 3 || b.Retrying != 1 || b.Blocked != 3 || b.HeldKeys != 1 {
		t.Errorf("billing stats after migration: %+v", b)
	}
	if sh := stats()["m4/shipping"]; sh.Pending != 1 || sh.Processing != 0 {
		t.Errorf("shipping stats after migration: %+v", sh)
	}

	claim := func(group string, limit int) map[string]outbox.Claimed {
		t.Helper()
		cs, err := s.Claim(ctx, outbox.ClaimRequest{Stream: "m4", Group: group, Worker: "w-new", Limit: limit, Lease: time.Minute, MaxAttempts: 5})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]outbox.Claimed{}
		for _, c := range cs {
			out[c.Key] = c
			r := byKey[c.Key]
			if string(c.Payload) != string(r.payload) || c.Kind != r.kind || c.Group != group || c.CreatedAt.UnixMicro() != r.createdAt || c.OrderingKey != r.orderingKey {
				t.Errorf("claimed %s: %+v, written %+v", c.Key, c, r)
			}
		}
		return out
	}
	ack := func(cs ...outbox.Claimed) {
		t.Helper()
		for _, c := range cs {
			if err := s.Acknowledge(ctx, outbox.Receipt{ID: c.ID, ClaimKey: c.ClaimKey}); err != nil {
				t.Fatalf("ack %s: %v", c.Key, err)
			}
		}
	}

	// Due now: e1, the heads e6 and e12, and e13 whose lease expired; not
	// e2 (its lease is live), e3 (retrying later), dead or blocked rows.
	got := claim("billing", 100)
	if keys := slices.Sorted(maps.Keys(got)); fmt.Sprint(keys) != "[e1 e12 e13 e6]" {
		t.Fatalf("first claim took %v", keys)
	}
	if md := got["e1"].Metadata; md["ü"] != "✓ \"quoted\"" || md["traceparent"] == "" {
		t.Errorf("e1 metadata: %v", md)
	}
	if c := got["e13"]; !c.Reclaimed || c.Attempts != 2 {
		t.Errorf("e13: reclaimed %v attempts %d, want true 2", c.Reclaimed, c.Attempts)
	}
	if c := got["e1"]; c.Reclaimed || c.Attempts != 1 {
		t.Errorf("e1: reclaimed %v attempts %d", c.Reclaimed, c.Attempts)
	}
	// e2's lease and claim key survived: its old receipt acknowledges it.
	if err := s.Acknowledge(ctx, outbox.Receipt{ID: ids["e2"], ClaimKey: "0123456789abcdef0123456789abcdef"}); err != nil {
		t.Errorf("the migrated lease of e2: %v", err)
	}
	// Per-key order: e7 and e8 come one at a time behind e6.
	ack(got["e1"], got["e12"], got["e13"], got["e6"])
	for _, want := range []string{"e7", "e8"} {
		next := claim("billing", 100)
		if len(next) != 1 || next[want].Key != want {
			t.Fatalf("after the head of k1: claimed %v, want only %s", slices.Sorted(maps.Keys(next)), want)
		}
		ack(next[want])
	}
	// The retrying row comes back at its time, with its attempts.
	if n := len(claim("billing", 100)); n != 0 {
		t.Fatalf("claimed %d rows before e3's retry time", n)
	}
	clock.Store(v4Base + 31*minute)
	retry := claim("billing", 100)
	if c, ok := retry["e3"]; !ok || len(retry) != 1 || c.Attempts != 3 {
		t.Fatalf("at e3's retry time: %v", retry)
	}
	ack(retry["e3"])

	// Dead letters list with their errors, and can be requeued.
	dead, err := s.ListDead(ctx, outbox.DeadQuery{Stream: "m4", Group: "billing", Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var deadDesc []string
	for _, d := range dead {
		deadDesc = append(deadDesc, fmt.Sprintf("%s:%s:%d:%s", d.Key, d.Kind, d.Attempts, d.LastError))
	}
	if fmt.Sprint(deadDesc) != "[e4:Refunded:5:gave up e9:Placed:5:poison e11:Placed:5:skipped]" {
		t.Errorf("dead letters: %v", deadDesc)
	}
	if n, err := s.Requeue(ctx, "m4", ids["e4"], ids["e9"]); err != nil || n != 2 {
		t.Fatalf("requeue: %d, %v", n, err)
	}
	again := claim("billing", 100)
	if fmt.Sprint(slices.Sorted(maps.Keys(again))) != "[e4 e9]" || again["e4"].Attempts != 1 {
		t.Fatalf("after requeue: %v", again)
	}
	ack(again["e4"], again["e9"])
	// e9 held k2: its acknowledgement lets e10 through.
	if next := claim("billing", 100); len(next) != 1 || next["e10"].Key != "e10" {
		t.Fatalf("after k2's head: %v", slices.Sorted(maps.Keys(next)))
	} else {
		ack(next["e10"])
	}

	// Delivered rows count, and Purge deletes those past the horizon: e5
	// (delivered two hours before the migration) only.
	groups, err := s.ListGroups(ctx, "m4")
	if err != nil {
		t.Fatal(err)
	}
	delivered := map[string]int64{}
	for _, g := range groups {
		delivered[g.Group] = g.Delivered
	}
	// billing: e5, e2 (its migrated receipt) and the 10 acknowledged
	// here; shipping: e2.
	if delivered["billing"] != 12 || delivered["shipping"] != 1 {
		t.Errorf("delivered per group: %v", delivered)
	}
	if n, err := s.Purge(ctx, time.Hour, 100); err != nil || n != 1 {
		t.Fatalf("purge: %d, %v", n, err)
	}
	if found, err := s.FindEvents(ctx, outbox.EventQuery{Stream: "m4", Key: "e5"}); err != nil || len(found) != 0 {
		t.Fatalf("e5 after purge: %v, %v", found, err)
	}

	// Idempotent re-enqueue of a migrated event: the same content is a
	// no-op with the first row's id, other content a conflict.
	e1 := byKey["e1"]
	tx, commit, rollback := db.Begin(t)
	res, err := s.Enqueue(ctx, tx, outbox.Event{Stream: "m4", Key: "e1", Kind: e1.kind, Payload: e1.payload})
	if err != nil || res.Inserted || res.ID != ids["e1"] {
		rollback()
		t.Fatalf("re-enqueue of e1: %+v, %v (first row %d)", res, err, ids["e1"])
	}
	if _, err := s.Enqueue(ctx, tx, outbox.Event{Stream: "m4", Key: "e1", Kind: e1.kind, Payload: []byte("other")}); !errors.Is(err, outbox.ErrIdempotencyConflict) {
		rollback()
		t.Fatalf("re-enqueue of e1 with other content: %v", err)
	}
	rollback()
	_ = commit

	// Group lifecycle: retire shipping (its pending e1 row goes, e1 stays
	// for billing), discard the remaining dead letter, reroute the default
	// group's waiting event to a group that takes its kind now.
	retired, err := s.RetireGroup(ctx, outbox.RetireRequest{Stream: "m4", Group: "shipping", Discard: true})
	if err != nil || retired.Pending != 1 {
		t.Fatalf("retire shipping: %+v, %v", retired, err)
	}
	if found, err := s.FindEvents(ctx, outbox.EventQuery{Stream: "m4", Key: "e1"}); err != nil || len(found) != 1 || found[0].Group != "billing" {
		t.Fatalf("e1 after retiring shipping: %v, %v", found, err)
	}
	if n, err := s.DiscardDead(ctx, outbox.DeadSelector{Stream: "m4", Group: "billing", All: true}); err != nil || n != 1 {
		t.Fatalf("discard dead: %d, %v", n, err)
	}
	if err := s.RegisterGroup(ctx, "m4d", "late", "Late"); err != nil {
		t.Fatal(err)
	}
	if n, err := s.ReroutePending(ctx, "m4d"); err != nil || n != 1 {
		t.Fatalf("reroute pending: %d, %v", n, err)
	}
	cs, err := s.Claim(ctx, outbox.ClaimRequest{Stream: "m4d", Group: "late", Worker: "w", Limit: 10, Lease: time.Minute, MaxAttempts: 5})
	if err != nil || len(cs) != 1 || cs[0].Key != "e14" || string(cs[0].Payload) != "payload of e14" || cs[0].Kind != "Late" {
		t.Fatalf("claim of the rerouted e14: %+v, %v", cs, err)
	}
	if b := stats()["m4/billing"]; b.Pending != 0 || b.Processing != 0 || b.Dead != 0 || b.Blocked != 0 || b.HeldKeys != 0 {
		t.Errorf("billing at the end: %+v", b)
	}
	// A new event gets ids above every migrated one.
	tx, commit, rollback = db.Begin(t)
	res, err = s.Enqueue(ctx, tx, outbox.Event{Stream: "m4", Key: "new", Kind: "Placed", Payload: []byte("n")})
	if err != nil {
		rollback()
		t.Fatal(err)
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}
	if res.ID <= ids["e14"] {
		t.Errorf("new event id %d is not above the migrated ids (last %d)", res.ID, ids["e14"])
	}
}

// execInOneSession runs stmts in order on one connection of sdb, as a
// migration tool runs a file: MariaDB/MySQL user variables and prepared
// statements belong to a session, so a pool could run a PREPARE and its
// DEALLOCATE on two connections.
func execInOneSession(t *testing.T, sdb *sql.DB, what string, stmts []string) {
	t.Helper()
	ctx := context.Background()
	conn, err := sdb.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, stmt := range stmts {
		if _, err := conn.ExecContext(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
}

// mysqlStatements splits a MariaDB migration file into its statements.
func mysqlStatements(t *testing.T, name string) []string {
	t.Helper()
	fsys, err := outbox.MigrationsFS("mysql")
	if err != nil {
		t.Fatal(err)
	}
	body, err := fs.ReadFile(fsys, name)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, part := range strings.Split(string(body), ";\n") {
		if s := strings.TrimSpace(part); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// through returns the statements up to the DEALLOCATE that follows the
// first statement containing marker: a run interrupted right after that
// step.
func through(t *testing.T, stmts []string, marker string) []string {
	t.Helper()
	for i, s := range stmts {
		if strings.Contains(s, marker) {
			for j := i; j < len(stmts); j++ {
				if strings.HasPrefix(stmts[j], "DEALLOCATE") || !strings.HasPrefix(stmts[i], "SET @millpond_step") {
					return stmts[:j+1]
				}
			}
		}
	}
	t.Fatalf("no statement contains %q", marker)
	return nil
}

// TestMigration0004ResumesOnMariaDB: MariaDB commits each DDL statement on
// its own, so an interrupted step 0004 leaves a part done. Run again, up
// and down finish with every row: interrupted after the copy (the old
// table renamed first, so an old replica's write of millpond_outbox fails
// meanwhile), after the old table was dropped, and down interrupted after
// the view was dropped.
func TestMigration0004ResumesOnMariaDB(t *testing.T) {
	for _, cut := range []string{"INSERT INTO millpond_deliveries", "DROP TABLE millpond_outbox"} {
		t.Run(strings.Fields(cut)[0]+"-"+strings.Fields(cut)[2], func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.New(t, "mysql")
			s, err := mysqlstore.New(db.SQL)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			sdb := s.SQLDB()
			installVersion3(t, sdb, "mysql")
			writeVersion3(t, sdb, "mysql", v4Rows())
			execInOneSession(t, sdb, "partial up", through(t, mysqlStatements(t, "0004_shared_events.up.sql"), cut))
			var want []string
			if cut == "INSERT INTO millpond_deliveries" {
				// The old table was renamed before the copy: a replica of
				// the previous version can no longer change it.
				if _, err := sdb.Exec("UPDATE millpond_outbox SET status = 'delivered', delivered_at = 1, attempts = 9 WHERE event_key = 'e1' AND consumer_group = 'billing'"); err == nil {
					t.Error("an old replica's UPDATE of millpond_outbox succeeded during the interrupted migration")
				}
				if _, err := sdb.Exec("INSERT INTO millpond_outbox (stream, consumer_group, event_key, event_kind, payload, metadata, content_hash, status, available_at, created_at) VALUES ('m4', '', 'late', 'Placed', 'x', '{}', 'h', 'pending', 1, 1)"); err == nil {
					t.Error("an old replica's INSERT into millpond_outbox succeeded during the interrupted migration")
				}
				want = dumpQuery(t, sdb, strings.Replace(dumpOutboxQuery("mysql"), "FROM millpond_outbox", "FROM millpond_outbox_0004", 1))
			}
			if err := s.Migrate(ctx); err != nil {
				t.Fatalf("migrate after the interruption: %v", err)
			}
			got := dumpOutbox(t, sdb, "mysql")
			if want == nil {
				// Cut after the drop: the copy was complete; compare with
				// a fresh migration of the same rows.
				want = freshMigratedDump(t)
			}
			compareDumps(t, "view after the resumed up", got, want)

			// Down, interrupted after the view is dropped, then run again.
			down := mysqlStatements(t, "0004_shared_events.down.sql")
			execInOneSession(t, sdb, "partial down", through(t, down, "DROP VIEW millpond_outbox"))
			execInOneSession(t, sdb, "resumed down", down)
			compareDumps(t, "table after the resumed down", dumpOutbox(t, sdb, "mysql"), want)
			// Down again on the 0003 table changes nothing.
			execInOneSession(t, sdb, "down again", down)
			compareDumps(t, "table after a second down", dumpOutbox(t, sdb, "mysql"), want)
		})
	}
}

// freshMigratedDump is the view of the test rows migrated in one go.
func freshMigratedDump(t *testing.T) []string {
	t.Helper()
	db := testdb.New(t, "mysql")
	s, err := mysqlstore.New(db.SQL)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	installVersion3(t, s.SQLDB(), "mysql")
	writeVersion3(t, s.SQLDB(), "mysql", v4Rows())
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return dumpOutbox(t, s.SQLDB(), "mysql")
}

// TestMigrateDownFromVersion3: Store.MigrateDown on a schema that never
// reached version 4 reverts it (step 4's down changes nothing there).
func TestMigrateDownFromVersion3(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, dialect)
			s := unmigratedStore(t, db)
			installVersion3(t, s.SQLDB(), dialect)
			writeVersion3(t, s.SQLDB(), dialect, v4Rows())
			if err := s.MigrateDown(context.Background()); err != nil {
				t.Fatalf("MigrateDown from version 3: %v", err)
			}
			if n := millpondTables(t, s); n != 0 {
				t.Fatalf("MigrateDown from version 3 left %d tables", n)
			}
			q := map[string]string{
				"postgres": "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = 'millpond_outbox'",
				"mysql":    "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = 'millpond_outbox'",
				"sqlite":   "SELECT COUNT(*) FROM sqlite_master WHERE name = 'millpond_outbox'",
			}[dialect]
			if n := db.Count(t, q); n != 0 {
				t.Fatal("MigrateDown from version 3 left millpond_outbox")
			}
		})
	}
}

// TestMigration0004DownKeepsIdempotencyRecords: under WithDeleteOnAck an
// acknowledged event keeps no delivery row; its millpond_events row is the
// key's idempotency record until Purge. The down step of 0004 rebuilt
// millpond_outbox from the rows only and dropped such events without a
// word: after down and up again a re-enqueue of the key was a new event,
// delivered a second time. The down step keeps each as a delivered row of
// the default group.
func TestMigration0004DownKeepsIdempotencyRecords(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.New(t, dialect)
			s := db.Store(t, outbox.WithDeleteOnAck(), outbox.WithoutListen())
			enqueue := func() outbox.Enqueued {
				t.Helper()
				tx, commit, rollback := db.Begin(t)
				res, err := s.Enqueue(ctx, tx, outbox.Event{Stream: "d", Key: "order-1", Kind: "Placed", Payload: []byte("p")})
				if err != nil {
					rollback()
					t.Fatal(err)
				}
				if err := commit(); err != nil {
					t.Fatal(err)
				}
				return res
			}
			enqueue()
			cs, err := s.Claim(ctx, outbox.ClaimRequest{Stream: "d", Worker: "w", Limit: 10, Lease: time.Minute, MaxAttempts: 3})
			if err != nil || len(cs) != 1 {
				t.Fatalf("claim: %d, %v", len(cs), err)
			}
			if err := s.Acknowledge(ctx, cs[0].Receipt()); err != nil {
				t.Fatal(err)
			}
			if n := db.Count(t, "SELECT COUNT(*) FROM millpond_deliveries"); n != 0 {
				t.Fatalf("%d delivery rows after the acknowledgement, want 0", n)
			}

			sdb := s.SQLDB()
			if dialect == "mysql" {
				migrationScript(t, sdb, dialect, "0007_claim_keeps_index.down.sql")
				migrationScript(t, sdb, dialect, "0005_status_off_indexes.down.sql")
				if _, err := sdb.Exec("DELETE FROM millpond_schema_migrations WHERE version IN (5, 7)"); err != nil {
					t.Fatal(err)
				}
			}
			migrationScript(t, sdb, dialect, "0004_shared_events.down.sql")
			if _, err := sdb.Exec("DELETE FROM millpond_schema_migrations WHERE version = 4"); err != nil {
				t.Fatal(err)
			}
			if kept := db.Count(t, "SELECT COUNT(*) FROM millpond_outbox WHERE event_key = 'order-1' AND consumer_group = '' AND status = 'delivered'"); kept != 1 {
				t.Errorf("0004 down kept %d delivered rows of the acknowledged key, want 1", kept)
			}
			if err := s.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			if res := enqueue(); res.Inserted {
				t.Errorf("after 0004 down and up a re-enqueue of the acknowledged key was inserted (%+v): it would be delivered twice", res)
			}
		})
	}
}
