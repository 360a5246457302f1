package sqlcore

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
)

// The PostgreSQL claim finds the rows it locked through the primary key.
// Joined with its CTE instead (UPDATE ... FROM due), the UPDATE was planned
// as a hash join over a sequential scan of the whole deliveries table, on
// every claim: in a table of 20,000 rows a claim of a few events read every
// one of them.
func TestPostgresClaimDoesNotScanTheTable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, db := postgresPlanCore(ctx, t, "mp_claim_plan")
	execAll(ctx, t, db,
		pendingEventsPG(20000),
		"ANALYZE millpond_events, millpond_deliveries",
	)
	for _, limit := range []int{1, 1000} {
		q := c.stmts.claim
		text := explain(t, db, q.text, q.args(map[string]any{
			"stream": "s", "group": "", "worker": "w", "limit": limit, "max": 10,
			"lease": micros(time.Minute), "now": nil, "hold": true, "after": int64(0), "key_bytes": claimKeyBytes(limit),
		}))
		if strings.Contains(text, "Seq Scan on millpond_deliveries") {
			t.Errorf("a claim of %d scans the whole table:\n%s", limit, text)
		}
		// A held claim's read of the rows and their events as well.
		held := c.stmts.claimHeld
		text = explain(t, db, held.text, held.args(map[string]any{
			"stream": "s", "group": "", "limit": limit, "max": 10, "now": nil, "hold": true, "after": int64(0), "idle": "60000",
		}))
		if strings.Contains(text, "Seq Scan on millpond_") {
			t.Errorf("a held claim of %d scans a whole table:\n%s", limit, text)
		}
	}
}

// postgresPlanCore migrates a schema of its own (name prefix and the
// process id) on the PostgreSQL server (MILLPOND_POSTGRES_URL), dropped when
// the test ends, and returns a Core over it and its pool.
func postgresPlanCore(ctx context.Context, t *testing.T, prefix string) (*Core, *sql.DB) {
	t.Helper()
	dsn := os.Getenv("MILLPOND_POSTGRES_URL")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	admin := openServer(ctx, t, "pgx", dsn, "postgres")
	schema := fmt.Sprintf("%s_%d", prefix, os.Getpid())
	if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	db, err := sql.Open("pgx", u.String())
	if err != nil {
		t.Fatal(err)
	}
	return migratedCore(ctx, t, Postgres, db, admin, "DROP SCHEMA "+schema+" CASCADE"), db
}

// openServer opens and pings a database server with an administrator's
// connection: the test fails when it is unreachable and
// MILLPOND_REQUIRE_DATABASES=1, and is skipped otherwise.
func openServer(ctx context.Context, t *testing.T, driver, dsn, label string) *sql.DB {
	t.Helper()
	admin, err := sql.Open(driver, dsn)
	if err == nil {
		err = admin.PingContext(ctx)
	}
	if err != nil {
		if os.Getenv("MILLPOND_REQUIRE_DATABASES") == "1" {
			t.Fatalf("%s: %v", label, err)
		}
		t.Skipf("%s unavailable: %v", label, err)
	}
	return admin
}

// migratedCore migrates a Core of dialect d over db; when the test ends it
// closes db, runs drop (which removes the test's schema or database) on
// admin, and closes admin.
func migratedCore(ctx context.Context, t *testing.T, d Dialect, db, admin *sql.DB, drop string) *Core {
	t.Helper()
	t.Cleanup(func() {
		db.Close()
		_, _ = admin.ExecContext(context.Background(), drop)
		admin.Close()
	})
	c, err := New(d, stdDB{db})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

// execAll runs the statements in order on db.
func execAll(ctx context.Context, t *testing.T, db *sql.DB, stmts ...string) {
	t.Helper()
	for _, stmt := range stmts {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
}

// stdDB puts a database/sql pool behind DB.
type stdDB struct{ db *sql.DB }

func (s stdDB) ExecContext(ctx context.Context, query string, args ...any) (Result, error) {
	return s.db.ExecContext(ctx, query, args...)
}

func (s stdDB) QueryContext(ctx context.Context, query string, args ...any) (Rows, error) {
	return s.db.QueryContext(ctx, query, args...)
}

func (s stdDB) BeginTx(ctx context.Context, opts *sql.TxOptions) (Tx, error) {
	tx, err := s.db.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return stdTx{tx}, nil
}

type stdTx struct{ tx *sql.Tx }

func (s stdTx) ExecContext(ctx context.Context, query string, args ...any) (Result, error) {
	return s.tx.ExecContext(ctx, query, args...)
}

func (s stdTx) QueryContext(ctx context.Context, query string, args ...any) (Rows, error) {
	return s.tx.QueryContext(ctx, query, args...)
}

func (s stdTx) Commit() error   { return s.tx.Commit() }
func (s stdTx) Rollback() error { return s.tx.Rollback() }

// The PostgreSQL claim returns its rows in the order its UPDATE found them
// (the table's physical order), which is not id order once rows moved, and
// Core.Claim sorts them: oldest first, as on every database.
func TestPostgresClaimReturnsOldestFirst(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, db := postgresPlanCore(ctx, t, "mp_claim_order")
	execAll(ctx, t, db,
		pendingEventsPG(300),
		// Rows of the first page grow past its free space and move to
		// later pages, after rows of higher ids.
		"UPDATE millpond_deliveries SET last_error = repeat('x', 500) WHERE id <= 40",
	)
	req := ClaimRequest{Stream: "s", Group: "", Worker: "w", Limit: 1000, Lease: time.Minute, MaxAttempts: 10}
	// The statement alone returns the rows out of id order.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	q := c.stmts.claim
	rows, err := tx.QueryContext(ctx, q.text, q.args(map[string]any{
		"stream": req.Stream, "group": req.Group, "worker": req.Worker, "limit": req.Limit, "max": req.MaxAttempts,
		"lease": micros(req.Lease), "now": nil, "hold": true, "after": int64(0), "key_bytes": claimKeyBytes(req.Limit),
	})...)
	if err != nil {
		t.Fatal(err)
	}
	var raw []int64
	for rows.Next() {
		var id int64
		vals := make([]any, 12) // the claim's columns
		vals[0] = &id
		for i := 1; i < len(vals); i++ {
			vals[i] = new(any)
		}
		if err := rows.Scan(vals...); err != nil {
			t.Fatal(err)
		}
		raw = append(raw, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback()
	if len(raw) != 300 || slices.IsSorted(raw) {
		t.Fatalf("the claim statement returned %d rows, sorted %v: the test needs all 300, out of id order", len(raw), slices.IsSorted(raw))
	}
	got, err := c.Claim(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 300 {
		t.Fatalf("claimed %d rows, want 300", len(got))
	}
	for i := 1; i < len(got); i++ {
		if got[i-1].ID >= got[i].ID {
			t.Fatalf("claimed rows out of id order: %d before %d", got[i-1].ID, got[i].ID)
		}
	}
}

// pendingEventsPG is a PostgreSQL statement inserting n events of stream s,
// each with a pending delivery row of the default group, in id order.
func pendingEventsPG(n int) string {
	return fmt.Sprintf(`WITH ev AS (
  INSERT INTO millpond_events (stream, event_key, event_kind, payload, metadata, content_hash, created_at)
  SELECT 's', 'k' || g, 'K', '\x7b7d', '{}', '\x00', 0 FROM generate_series(1, %d) AS g RETURNING id)
INSERT INTO millpond_deliveries (event_id, stream, consumer_group, status, available_at)
SELECT id, 's', '', 'pending', 0 FROM ev ORDER BY id`, n)
}
