package sqlcore

import (
	"context"
	"database/sql"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"
)

// A MySQL statement that settles, claims or deletes a list of rows
// (delivery or event ids, ordering keys) locks those rows and no others,
// however small the table:
// over a table of a few hundred rows MariaDB's optimizer prefers scanning
// the whole primary key to 25 point lookups, and a locking scan waits for
// every row another transaction holds, so two acknowledgements of
// different rows waited for each other's rows and deadlocked, six times in
// a row in one run (an acknowledgement lost, its events delivered again).
// Each statement here runs beside a transaction holding a row outside its
// list, with a lock wait timeout of one second: it must not wait at all.
func TestMySQLListStatementsLockOnlyTheirRows(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, db := mysqlPlanCore(ctx, t)
	del, err := New(MySQL, stdDB{db}, WithDeleteOnAck())
	if err != nil {
		t.Fatal(err)
	}
	// 300 events of 100 keys on one stream, delivery ids 1-300; key rows
	// for the 100 keys. ANALYZE TABLE: the statistics of a small table.
	execAll(ctx, t, db,
		`INSERT INTO millpond_events (created_at, stream, event_key, event_kind, content_hash, metadata, payload)
SELECT 0, 's', CONCAT('k', a.d, b.d, c.d), 'K', UNHEX(SHA2('', 256)), '{}', '{}'
FROM `+digits+` a, `+digits+` b, `+digits+` c WHERE a.d < 3`,
		`INSERT INTO millpond_deliveries (event_id, stream, consumer_group, status, available_at, ordering_key, ordering_seq)
SELECT id, 's', '', 'processing', 9000000000000000, CONCAT('key-', LPAD(id % 100, 3, '0')), 1 + id DIV 100 FROM millpond_events ORDER BY id`,
		`INSERT INTO millpond_ordering (stream, consumer_group, ordering_key, last_seq, unsettled)
SELECT 's', '', CONCAT('key-', a.d, b.d, c.d), 3, 3 FROM `+digits+` a, `+digits+` b, `+digits+` c WHERE a.d = 0`,
		"ANALYZE TABLE millpond_deliveries, millpond_ordering",
	)
	// The list: 25 rows from id 101 on, every fourth; the held row, 102,
	// lies inside its range and 1 below it.
	var ids []int64
	var rs []Receipt
	var keys []orderKey
	for id := int64(101); len(ids) < 25; id += 4 {
		ids = append(ids, id)
		rs = append(rs, Receipt{ID: id, ClaimKey: strings.Repeat("a", 32)})
		keys = append(keys, orderKey{"s", "", fmt.Sprintf("key-%03d", id%100)})
	}
	now := map[string]any{"now": int64(1000), "worker": "w", "lease": int64(1e6), "max": 5, "delay": int64(0), "reason": "", "stream": "s"}
	withIDs := func(q query) (string, []any) { return c.withIDs(q, maps.Clone(now), ids) }
	withPairs := func(q query) (string, []any) {
		text, args := expandPairs(MySQL, q.text, rs)
		return text, append(q.args(now), args...)
	}
	withReceipts := func(q query) (string, []any) {
		vals := maps.Clone(now)
		vals["ids"] = jsonIDs(ids)
		text, args := expandReceipts(q.text, rs)
		return text, append(q.args(vals), args...)
	}
	type stmt struct {
		name string
		make func() (string, []any)
	}
	stmts := []stmt{
		{"claim update", func() (string, []any) {
			text, args := expandIDs(c.stmts.claimUpdate, ids)
			return text, append([]any{"w", int64(1e15), "secret"}, args...)
		}},
		{"claim dead letter", func() (string, []any) { return withIDs(c.stmts.claimDead) }},
		{"acknowledge's locking read", func() (string, []any) { return withPairs(c.stmts.ack) }},
		{"acknowledge's mark", func() (string, []any) { return withIDs(c.stmts.ackMark) }},
		{"acknowledge's first try", func() (string, []any) { return withReceipts(c.stmts.ackAll) }},
		{"acknowledge's delete", func() (string, []any) { return withIDs(del.stmts.ackMark) }},
		{"delete rows", func() (string, []any) { return withIDs(c.stmts.deleteDeliveries) }},
		{"claim's locking read", func() (string, []any) {
			text, args := withIDs(c.stmts.claimSelect)
			return strings.Replace(text, "{limit}", "100", 1), args
		}},
		{"lifecycle's locking read", func() (string, []any) { return withIDs(c.stmts.lifecycle.lockUndelivered) }},
		{"lifecycle's locking read of dead letters", func() (string, []any) { return withIDs(c.stmts.lifecycle.lockDead) }},
		{"lifecycle's locking read of pending rows", func() (string, []any) { return withIDs(c.stmts.lifecycle.lockPending) }},
		{"dead ordered rows' locking read", func() (string, []any) { return withIDs(c.stmts.orderedDead) }},
		{"events' locking read", func() (string, []any) { return withIDs(c.stmts.lockEvents) }},
		{"orphan events' delete", func() (string, []any) { return withIDs(c.stmts.dropOrphans) }},
		{"acknowledge's first try, deleting", func() (string, []any) { return withReceipts(del.stmts.ackAll) }},
		{"promote", func() (string, []any) { return withIDs(c.stmts.promoteIDs) }},
		{"hand over's locking read", func() (string, []any) { return withIDs(c.stmts.lockBlocked) }},
		{"held claim's settle", func() (string, []any) { return withIDs(c.stmts.heldDeliver) }},
		{"held claim's settle, deleting", func() (string, []any) { return withIDs(del.stmts.heldDeliver) }},
		{"held claim's lease", func() (string, []any) {
			vals := maps.Clone(now)
			keys := make([]string, len(ids))
			for i := range keys {
				keys[i] = strings.Repeat("b", 32)
			}
			vals["pairs"] = jsonPairs(ids, keys)
			return c.stmts.heldLease.text, c.stmts.heldLease.args(vals)
		}},
		{"extend", func() (string, []any) { return withPairs(c.stmts.extend) }},
		{"release", func() (string, []any) { return withPairs(c.stmts.release) }},
		{"requeue", func() (string, []any) { return withIDs(c.stmts.requeue) }},
		{"release keys", func() (string, []any) {
			text, args := expandKeys(MySQL, c.stmts.releaseKeys.text, keys)
			return text, append(c.stmts.releaseKeys.args(nil), args...)
		}},
	}
	check := func(size string) {
		for _, held := range []struct{ what, lock string }{
			{"delivery 102", "SELECT id FROM millpond_deliveries WHERE id = 102 FOR UPDATE"},
			{"delivery 1", "SELECT id FROM millpond_deliveries WHERE id = 1 FOR UPDATE"},
			{"event 102", "SELECT id FROM millpond_events WHERE id = 102 FOR UPDATE"},
			{"event 1", "SELECT id FROM millpond_events WHERE id = 1 FOR UPDATE"},
			{"key key-000", "SELECT ordering_key FROM millpond_ordering WHERE stream = 's' AND consumer_group = '' AND ordering_key = 'key-000' FOR UPDATE"},
			{"key key-002", "SELECT ordering_key FROM millpond_ordering WHERE stream = 's' AND consumer_group = '' AND ordering_key = 'key-002' FOR UPDATE"},
		} {
			holder, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := holder.ExecContext(ctx, held.lock); err != nil {
				t.Fatal(err)
			}
			for _, s := range stmts {
				text, args := s.make()
				tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := tx.ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = 1"); err != nil {
					t.Fatal(err)
				}
				rows, err := tx.QueryContext(ctx, text, args...)
				if err == nil {
					for rows.Next() {
					}
					err = rows.Err()
					rows.Close()
				}
				if err != nil {
					t.Errorf("%s: %s, with %s held by another transaction: %v", size, s.name, held.what, err)
				}
				if err := tx.Rollback(); err != nil {
					t.Fatal(err)
				}
			}
			if err := holder.Rollback(); err != nil {
				t.Fatal(err)
			}
		}
	}
	check("300 rows")
	// Then tables of 27 rows: the list, 1 and 102 (the optimizer scans a
	// table whose rows are about as many as the list's).
	list := strings.Trim(strings.Join(strings.Fields(fmt.Sprint(ids)), ", "), "[]")
	execAll(ctx, t, db,
		"DELETE FROM millpond_deliveries WHERE id NOT IN (1, 102, "+list+")",
		"DELETE FROM millpond_events WHERE id NOT IN (1, 102, "+list+")",
		"ANALYZE TABLE millpond_deliveries, millpond_events",
	)
	check("27 rows")
	// And of 3 rows, 101 (the list), 1 and 102: a join to a list scans
	// a table this small unless told not to.
	ids, rs, keys = ids[:1], rs[:1], keys[:1]
	execAll(ctx, t, db,
		"DELETE FROM millpond_deliveries WHERE id NOT IN (1, 101, 102)",
		"DELETE FROM millpond_events WHERE id NOT IN (1, 101, 102)",
		"ANALYZE TABLE millpond_deliveries, millpond_events",
	)
	check("3 rows")
}
