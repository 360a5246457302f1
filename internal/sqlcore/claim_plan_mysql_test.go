package sqlcore

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// A MySQL claim reads due rows through the due index, one ordered range per
// state, so the rows of a blocked key (status 'blocked') are never read. The
// test counts the rows InnoDB hands the server for the claim's due read
// (Handler_read_* of the session) with 10,000 blocked rows behind one head:
// a read through another index, or one that filters the blocked rows out
// instead of never reaching them, reads them all. Counted rows do not
// depend on the machine's load, unlike timings.
func TestMySQLClaimDoesNotReadBlockedRows(t *testing.T) {
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
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin, err := sql.Open("mysql", cfg.FormatDSN())
	if err == nil {
		err = admin.PingContext(ctx)
	}
	if err != nil {
		if os.Getenv("MILLPOND_REQUIRE_DATABASES") == "1" {
			t.Fatalf("mysql: %v", err)
		}
		t.Skipf("mysql unavailable: %v", err)
	}
	defer admin.Close()
	name := fmt.Sprintf("mp_claim_plan_%d", os.Getpid())
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = admin.ExecContext(context.Background(), "DROP DATABASE "+name) }()
	cfg.DBName = name
	cfg.MultiStatements = true
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	c, err := New(MySQL, stdDB{db})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	const blocked = 9_999 // and the head: 10,000 rows
	digits := "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)"
	for _, stmt := range []string{
		`INSERT INTO millpond_events (created_at, stream, event_key, event_kind, content_hash, metadata, payload)
SELECT 0, 's', CONCAT('k', a.d, b.d, c.d, e.d), 'K', UNHEX(SHA2('', 256)), '{}', '{}'
FROM ` + digits + ` a, ` + digits + ` b, ` + digits + ` c, ` + digits + ` e`,
		// The key's head is in flight under a lease; the rest wait behind it.
		`INSERT INTO millpond_deliveries (event_id, stream, consumer_group, status, available_at, ordering_key, ordering_seq)
SELECT id, 's', '', IF(id = 1, 'processing', 'blocked'), IF(id = 1, 9000000000000000, 0), 'hot', id FROM millpond_events ORDER BY id`,
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	// No ANALYZE TABLE: statistics as they are right after a large
	// enqueue.
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	q := c.stmts.claimDue
	args := q.args(map[string]any{"stream": "s", "group": "", "limit": 100, "now": time.Now().UnixMicro()})
	var read int64
	for range 2 { // the first read warms the server's caches
		if _, err := conn.ExecContext(ctx, "FLUSH STATUS"); err != nil {
			t.Fatal(err)
		}
		rows, err := conn.QueryContext(ctx, q.text, args...)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for rows.Next() {
			n++
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		rows.Close()
		if n != 0 {
			t.Fatalf("the due read found %d rows behind a head in flight", n)
		}
		status, err := conn.QueryContext(ctx, "SHOW SESSION STATUS WHERE Variable_name LIKE 'Handler_read%' OR Variable_name = 'Handler_icp_attempts'")
		if err != nil {
			t.Fatal(err)
		}
		read = 0
		var counts []string
		for status.Next() {
			var k string
			var v int64
			if err := status.Scan(&k, &v); err != nil {
				t.Fatal(err)
			}
			// Handler_read_key counts index lookups, the other
			// Handler_read_* rows read by a scan, Handler_icp_attempts
			// (MariaDB) index entries a pushed-down condition checked
			// inside InnoDB, which the Handler_read_* counters miss.
			read += v
			if v != 0 {
				counts = append(counts, fmt.Sprintf("%s=%d", k, v))
			}
		}
		status.Close()
		t.Logf("due read with %d blocked rows: %s", blocked, strings.Join(counts, " "))
	}
	if read > 100 {
		t.Fatalf("the claim's due read reads %d rows with %d blocked rows behind one head", read, blocked)
	}
}
