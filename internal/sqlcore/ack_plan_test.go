package sqlcore

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"
)

// The PostgreSQL statements that lock the rows of receipts (acknowledge,
// extend, release, acknowledge ordered rows) look each receipt up through
// the primary key, and the claim does not join its claimed rows with its
// due rows. A join of the table with the receipts was planned from
// the statistics: once they said processing rows were rare (most rows
// delivered when the table was analyzed, then a batch claimed), it read the
// whole table and compared every processing row with every receipt, and an
// acknowledgement of 1,000 events took over a second. The plans are checked
// custom and generic (the plan a prepared statement settles on).
func TestPostgresPlansDoNotDependOnStatistics(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, db := postgresPlanCore(ctx, t, "mp_ack_plan")
	// 20,000 delivered rows analyzed, then 2,000 claimed: the statistics
	// say almost no row is processing.
	execAll(ctx, t, db,
		`WITH ev AS (
  INSERT INTO millpond_events (stream, event_key, event_kind, payload, metadata, content_hash, created_at)
  SELECT 's', 'k' || g, 'K', '\x7b7d', '{}', '\x00', 0 FROM generate_series(1, 20000) AS g RETURNING id)
INSERT INTO millpond_deliveries (event_id, stream, consumer_group, status, settled, available_at, delivered_at)
SELECT id, 's', '', 'delivered', true, 0, 1 FROM ev ORDER BY id`,
		"UPDATE millpond_deliveries SET status = 'pending', settled = false, delivered_at = 0 WHERE id > 18000",
		"VACUUM millpond_events, millpond_deliveries",
	)
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// The claim, before the table's columns have statistics (a new or
	// truncated table, until autovacuum analyzes it), does not join its
	// claimed rows with its due rows.
	claimVals := map[string]any{"stream": "s", "group": "", "worker": "w", "limit": 1000, "max": 10,
		"lease": micros(time.Minute), "now": nil, "hold": true, "after": int64(0), "key_bytes": claimKeyBytes(1000)}
	for _, mode := range []string{"auto", "force_generic_plan"} {
		if _, err := conn.ExecContext(ctx, "SET plan_cache_mode = "+mode); err != nil {
			t.Fatal(err)
		}
		// Which join the planner picks for claimed and due rows depends on
		// its estimates (a nested loop comparing each with each, 1,000,000
		// comparisons in a claim of 1,000, on a bench database whose table
		// had not been analyzed): there must be none.
		text := explain(t, conn, c.stmts.claim.text, c.stmts.claim.args(claimVals))
		if strings.Contains(text, "Seq Scan on millpond_deliveries") || strings.Contains(text, "due.id") {
			t.Errorf("claim (plan_cache_mode %s) joins its claimed rows with its due rows:\n%s", mode, text)
		}
	}
	execAll(ctx, t, db,
		"UPDATE millpond_deliveries SET status = 'delivered', settled = true, delivered_at = 1 WHERE id > 18000",
		"ANALYZE millpond_events, millpond_deliveries",
		`UPDATE millpond_deliveries SET status = 'processing', settled = false, delivered_at = 0,
  available_at = 9000000000000000, claim_key = md5(id::TEXT) WHERE id <= 2000`,
	)
	ids := make([]int64, 1000)
	keys := make([]string, 1000)
	for i := range ids {
		ids[i] = int64(i + 1)
	}
	rows, err := db.QueryContext(ctx, "SELECT md5(g::TEXT) FROM generate_series(1, 1000) AS g ORDER BY g")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; rows.Next(); i++ {
		if err := rows.Scan(&keys[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	del := buildStatements(Postgres, true) // the acknowledgements that delete (WithDeleteOnAck)
	vals := map[string]any{"ids": ids, "keys": keys, "now": nil, "lease": micros(time.Minute),
		"stream": "s", "group": "", "worker": "w", "limit": 1000, "max": 10, "secret": newClaimKey()}
	for _, mode := range []string{"auto", "force_generic_plan"} {
		if _, err := conn.ExecContext(ctx, "SET plan_cache_mode = "+mode); err != nil {
			t.Fatal(err)
		}
		for name, q := range map[string]query{"ack": c.stmts.ack, "ackNext": c.stmts.ackNext, "ackOrdered": c.stmts.ackOrdered, "extend": c.stmts.extend, "release": c.stmts.release,
			"ack (deleteOnAck)": del.ack, "ackNext (deleteOnAck)": del.ackNext, "ackOrdered (deleteOnAck)": del.ackOrdered} {
			text := explain(t, conn, q.text, q.args(vals))
			if strings.Contains(text, "Seq Scan on millpond_deliveries") || strings.Contains(text, "Join Filter: ((o.id = r.id)") {
				t.Errorf("%s (plan_cache_mode %s) does not look the receipts up by id:\n%s", name, mode, text)
			}
		}
	}
	// The key rows of ordered receipts are looked up by key, not read
	// whole: a stream of 100,000 ordering keys, analyzed.
	execAll(ctx, t, db,
		`INSERT INTO millpond_ordering (stream, consumer_group, ordering_key, last_seq, unsettled)
  SELECT 's', '', 'key' || g, 1, 1 FROM generate_series(1, 100000) AS g`,
		"ANALYZE millpond_ordering",
	)
	for _, mode := range []string{"auto", "force_generic_plan"} {
		if _, err := conn.ExecContext(ctx, "SET plan_cache_mode = "+mode); err != nil {
			t.Fatal(err)
		}
		for name, q := range map[string]query{"ack": c.stmts.ack, "ackNext": c.stmts.ackNext, "ackOrdered": c.stmts.ackOrdered, "release": c.stmts.release,
			"ack (deleteOnAck)": del.ack, "ackNext (deleteOnAck)": del.ackNext, "ackOrdered (deleteOnAck)": del.ackOrdered} {
			text := explain(t, conn, q.text, q.args(vals))
			if strings.Contains(text, "Seq Scan on millpond_ordering") {
				t.Errorf("%s (plan_cache_mode %s) reads every key row of 100,000:\n%s", name, mode, text)
			}
		}
	}
	// And the statement still does its job: the first 1,000 rows are
	// acknowledged, in one statement.
	settled, err := c.ack(ctx, stdDB{db}, receiptsOf(ids, keys))
	if err != nil {
		t.Fatal(err)
	}
	if len(settled) != len(ids) {
		t.Fatalf("acknowledged %d of %d", len(settled), len(ids))
	}
}

// explain is the plan of a statement with its arguments, on a connection
// (whose settings it keeps) or a pool.
func explain(t *testing.T, conn interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, text string, args []any) string {
	t.Helper()
	rows, err := conn.QueryContext(context.Background(), "EXPLAIN "+text, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, line)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return strings.Join(plan, "\n")
}

func receiptsOf(ids []int64, keys []string) []Receipt {
	rs := make([]Receipt, len(ids))
	for i := range ids {
		rs[i] = Receipt{ID: ids[i], ClaimKey: keys[i]}
	}
	return rs
}
