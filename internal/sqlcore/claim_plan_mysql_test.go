package sqlcore

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// A MySQL claim reads due rows through the phase index, one ordered range,
// so the rows of a blocked key (status 'blocked') are never read. The
// test counts the rows InnoDB hands the server for the claim's due read
// (Handler_read_* of the session) with 10,000 blocked rows behind one head:
// a read through another index, or one that filters the blocked rows out
// instead of never reaching them, reads them all. Counted rows do not
// depend on the machine's load, unlike timings.
func TestMySQLClaimDoesNotReadBlockedRows(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, db := mysqlPlanCore(ctx, t)
	const blocked = 9_999 // and the head: 10,000 rows
	execAll(ctx, t, db,
		`INSERT INTO millpond_events (created_at, stream, event_key, event_kind, content_hash, metadata, payload)
SELECT 0, 's', CONCAT('k', a.d, b.d, c.d), 'K', UNHEX(SHA2('', 256)), '{}', '{}'
FROM `+digits+` a, `+digits+` b, `+digits+` c`,
		// The key's head is in flight under a lease; the rest wait behind it.
		`INSERT INTO millpond_deliveries (event_id, stream, consumer_group, status, available_at, ordering_key, ordering_seq)
SELECT id, 's', '', IF(id = 1, 'processing', 'blocked'), IF(id = 1, 9000000000000000, 0), 'hot', id FROM millpond_events ORDER BY id`,
	)
	// No ANALYZE TABLE: statistics as they are right after a large
	// enqueue.
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	q := c.stmts.claimDue
	read, counts := handlerReads(ctx, t, conn, q.text, q.args(map[string]any{"stream": "s", "group": "", "limit": 100, "now": time.Now().UnixMicro(), "after": int64(0)}))
	t.Logf("claim's due read with %d blocked rows: %s", blocked, counts)
	if read > 100 {
		t.Fatalf("the claim's due read reads %d rows with %d blocked rows behind one head", read, blocked)
	}
}

// Pending and processing rows share phase 1 of the phase index (migration
// 0007), so a claim, which turns one into the other, moves no entry of any
// secondary index: none holds status. The claim's due read takes that one
// range in id order and stops at @limit due rows: with 1,000 rows in
// flight above 100 due ones (50 pending, 50 whose lease expired) and 7,000
// delivered or dead-lettered rows below, it reads the 100 due rows only,
// where a read of each state's range (the due index of version 5, keyed by
// status) reads every processing row to find the expired ones. (In-flight
// rows below the due ones, the usual layout, are still read one each: the
// range is in id order and their available_at is checked in the row.)
func TestMySQLClaimReadsOnePhase(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, db := mysqlPlanCore(ctx, t)
	var withStatus int64
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.STATISTICS
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'millpond_deliveries' AND COLUMN_NAME = 'status'`).Scan(&withStatus); err != nil {
		t.Fatal(err)
	}
	if withStatus != 0 {
		t.Errorf("%d index columns of millpond_deliveries hold status: a claim moves their entries", withStatus)
	}
	const live = 9_000_000_000_000_000
	execAll(ctx, t, db,
		`INSERT INTO millpond_events (created_at, stream, event_key, event_kind, content_hash, metadata, payload)
SELECT 0, 's', CONCAT('k', a.d, b.d, c.d, e.d), 'K', UNHEX(SHA2('', 256)), '{}', '{}'
FROM `+digits+` a, `+digits+` b, `+digits+` c, `+digits+` e`,
		// ids 1-5,000 delivered, 5,001-7,000 dead, 7,001-7,050 processing
		// under an expired lease, 7,051-7,100 pending, 7,101-8,100 in
		// flight; the rest are another group's.
		`INSERT INTO millpond_deliveries (event_id, stream, consumer_group, status, available_at, delivered_at)
SELECT id, 's', IF(id > 8100, 'other', ''),
  CASE WHEN id <= 5000 THEN 'delivered' WHEN id <= 7000 THEN 'dead_letter' WHEN id <= 7050 THEN 'processing'
    WHEN id <= 7100 THEN 'pending' ELSE 'processing' END,
  IF(id > 7100, `+fmt.Sprint(live)+`, 0), IF(id <= 5000, 1000 + id, 0) FROM millpond_events ORDER BY id`,
	)
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	q := c.stmts.claimDue
	args := q.args(map[string]any{"stream": "s", "group": "", "limit": 100, "now": int64(1000), "after": int64(0)})
	read, counts := handlerReads(ctx, t, conn, q.text, args)
	t.Logf("claim's due read of 100 due rows below 1,000 in flight: %s", counts)
	// Each row counts about twice (its index entry, then the row).
	if read > 250 {
		t.Errorf("the claim's due read reads %d rows for 100 due ones", read)
	}
	due, err := c.queryIDs(ctx, c.db, q.text, args)
	if err != nil {
		t.Fatal(err)
	}
	if len(due) != 100 || !due[7001] || !due[7100] {
		t.Errorf("the claim's due read found %d rows; want ids 7,001-7,100", len(due))
	}
}

// The other reads of MySQL's indexes without status (migration 0005) do
// not walk rows of other states: a key's next event is found past its
// delivered rows, Purge finds no delivered row among undelivered ones
// without reading them, and Stats reads the undelivered rows only.
func TestMySQLIndexesWithoutStatusReadOnlyTheirRows(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, db := mysqlPlanCore(ctx, t)
	// Stream h, key "hot": 9,998 delivered events, a head in flight, one
	// blocked event; key "other" below. Stream s: 1,000 pending events without a key.
	execAll(ctx, t, db,
		`INSERT INTO millpond_events (created_at, stream, event_key, event_kind, content_hash, metadata, payload)
SELECT 0, 'h', CONCAT('k', a.d, b.d, c.d, e.d), 'K', UNHEX(SHA2('', 256)), '{}', '{}'
FROM `+digits+` a, `+digits+` b, `+digits+` c, `+digits+` e`,
		`INSERT INTO millpond_deliveries (event_id, stream, consumer_group, status, available_at, delivered_at, ordering_key, ordering_seq)
SELECT id, 'h', '', CASE WHEN id <= 9998 THEN 'delivered' WHEN id = 9999 THEN 'processing' ELSE 'blocked' END, 0,
  CASE WHEN id <= 9998 THEN 1000 + id ELSE 0 END, 'hot', id FROM millpond_events ORDER BY id`,
		`INSERT INTO millpond_ordering (stream, consumer_group, ordering_key, last_seq, unsettled) VALUES ('h', '', 'hot', 10000, 2)`,
		// Key "other" of stream h: a head in flight and 99 blocked events.
		`INSERT INTO millpond_events (created_at, stream, event_key, event_kind, content_hash, metadata, payload)
SELECT 0, 'x', CONCAT('k', a.d, b.d), 'K', UNHEX(SHA2('', 256)), '{}', '{}'
FROM `+digits+` a, `+digits+` b`,
		`INSERT INTO millpond_deliveries (event_id, stream, consumer_group, status, available_at, ordering_key, ordering_seq)
SELECT id, 'h', '', CASE WHEN id = 10001 THEN 'processing' ELSE 'blocked' END, 0, 'other', id - 10000 FROM millpond_events WHERE stream = 'x' ORDER BY id`,
		`INSERT INTO millpond_events (created_at, stream, event_key, event_kind, content_hash, metadata, payload)
SELECT 0, 's', CONCAT('k', a.d, b.d, c.d), 'K', UNHEX(SHA2('', 256)), '{}', '{}'
FROM `+digits+` a, `+digits+` b, `+digits+` c`,
		`INSERT INTO millpond_deliveries (event_id, stream, consumer_group, status, available_at)
SELECT id, 's', '', 'pending', 0 FROM millpond_events WHERE stream = 's' ORDER BY id`,
	)
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, r := range []struct {
		name string
		text string
		args []any
		most int64
	}{
		{"next blocked event of a key behind 9,998 delivered ones, beside another key's 99 blocked ones", "", nil, 20},
		{"purge with 1,102 undelivered rows and none due", c.stmts.purgeSelect.text,
			c.stmts.purgeSelect.args(map[string]any{"now": int64(1000), "horizon": int64(0), "limit": 100}), 20},
		{"stats of 1,102 undelivered rows beside 9,998 delivered ones", c.stmts.stats.text, c.stmts.stats.args(map[string]any{"now": int64(0)}), 4 * 1_102},
	} {
		if r.text == "" {
			r.text, r.args = expandKeys(MySQL, c.stmts.nextBlocked.text, []orderKey{{"h", "", "hot"}})
			r.args = append(c.stmts.nextBlocked.args(nil), r.args...)
		}
		read, counts := handlerReads(ctx, t, conn, r.text, r.args)
		t.Logf("%s: %s", r.name, counts)
		if read > r.most {
			t.Errorf("%s: %d rows read, want at most %d", r.name, read, r.most)
		}
	}
}

// digits is a derived table of the rows 0 to 9.
const digits = "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)"

// mysqlPlanCore migrates a new database of its own on the MySQL server
// (MILLPOND_MYSQL_URL), dropped when the test ends, and returns a Core over
// it and its pool.
func mysqlPlanCore(ctx context.Context, t *testing.T) (*Core, *sql.DB) {
	t.Helper()
	raw := os.Getenv("MILLPOND_MYSQL_URL")
	if raw == "" {
		raw = "mysql://root@127.0.0.1:3306/test"
	}
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	cfg := mysql.NewConfig()
	cfg.Net, cfg.Addr, cfg.User = "tcp", u.Host, u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	admin := openServer(ctx, t, "mysql", cfg.FormatDSN(), "mysql")
	name := fmt.Sprintf("mp_plan_%d_%d", os.Getpid(), planDBs.Add(1))
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	cfg.DBName = name
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	return migratedCore(ctx, t, MySQL, db, admin, "DROP DATABASE "+name), db
}

var planDBs atomic.Int64

// handlerReads runs a query twice on conn (the first warms the caches) and
// returns how many rows and index entries the second read: the session's
// Handler_read_* counters and Handler_icp_attempts (MariaDB: index entries
// a pushed-down condition checked inside InnoDB, which the Handler_read_*
// counters miss), and the non-zero counters as text. Counted rows do not
// depend on the machine's load, unlike timings.
func handlerReads(ctx context.Context, t *testing.T, conn *sql.Conn, text string, args []any) (int64, string) {
	t.Helper()
	var read int64
	var counts []string
	for range 2 {
		if _, err := conn.ExecContext(ctx, "FLUSH STATUS"); err != nil {
			t.Fatal(err)
		}
		rows, err := conn.QueryContext(ctx, text, args...)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		rows.Close()
		status, err := conn.QueryContext(ctx, "SHOW SESSION STATUS WHERE Variable_name LIKE 'Handler_read%' OR Variable_name = 'Handler_icp_attempts'")
		if err != nil {
			t.Fatal(err)
		}
		read, counts = 0, nil
		for status.Next() {
			var k string
			var v int64
			if err := status.Scan(&k, &v); err != nil {
				t.Fatal(err)
			}
			read += v
			if v != 0 {
				counts = append(counts, fmt.Sprintf("%s=%d", k, v))
			}
		}
		status.Close()
	}
	return read, strings.Join(counts, " ")
}
