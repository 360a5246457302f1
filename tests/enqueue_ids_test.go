package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/go-sql-driver/mysql"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
	mysqlstore "github.com/millpond/millpond/outbox/mysql"
)

// countOnlyTx is a watermill-sql transaction whose results report only
// RowsAffected (the interface's whole promise), not LastInsertId.
type countOnlyTx struct{ wsql.Tx }

type countOnly struct{ n int64 }

func (r countOnly) RowsAffected() (int64, error) { return r.n, nil }

func (t countOnlyTx) ExecContext(ctx context.Context, query string, args ...any) (wsql.Result, error) {
	res, err := t.Tx.ExecContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	n, err := res.RowsAffected()
	return countOnly{n}, err
}

// TestEnqueueIDsWithoutLastInsertID: Enqueue returns the lowest delivery
// row id of a new event, with its rows inserted for each of three groups,
// whether the caller's transaction reports the inserted ids
// (database/sql) or not (a watermill-sql transaction that reports only
// counts: SQLite then reads last_insert_rowid()). MySQL cannot tell an
// insert's id from an earlier one's without the result's: it refuses such a
// transaction with a clear error.
func TestEnqueueIDsWithoutLastInsertID(t *testing.T) {
	for _, dialect := range []string{"sqlite", "mysql"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, dialect)
			store := db.Store(t)
			ctx := context.Background()
			for _, g := range []string{"a", "b", "c"} {
				if err := store.RegisterGroup(ctx, "s", g); err != nil {
					t.Fatal(err)
				}
			}
			wrap := map[string]func(*sql.Tx) outbox.Tx{
				"sql":        outbox.SQLTx,
				"count-only": func(tx *sql.Tx) outbox.Tx { return outbox.WatermillSQLTx(countOnlyTx{wsql.TxFromStdSQL(tx)}) },
			}
			for _, how := range []string{"sql", "count-only", "sql", "count-only"} {
				raw, err := db.SQL.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				key := fmt.Sprintf("%s-%d", how, db.Count(t, "SELECT count(*) FROM millpond_events"))
				res, err := store.Enqueue(ctx, wrap[how](raw), outbox.Event{Stream: "s", Key: key, Kind: "K", Payload: []byte("x")})
				if dialect == "mysql" && how == "count-only" {
					_ = raw.Rollback()
					if err == nil || !strings.Contains(err.Error(), "LastInsertId") {
						t.Fatalf("MySQL transaction without LastInsertId: %+v, %v", res, err)
					}
					continue
				}
				if err != nil {
					_ = raw.Rollback()
					t.Fatal(err)
				}
				if err := raw.Commit(); err != nil {
					t.Fatal(err)
				}
				low := db.Count(t, "SELECT min(id) FROM millpond_outbox WHERE event_key = ?", key)
				high := db.Count(t, "SELECT max(id) FROM millpond_outbox WHERE event_key = ?", key)
				if !res.Inserted || res.ID != low || high-low != 2 {
					t.Fatalf("%s: Enqueue returned %+v; rows %d-%d", how, res, low, high)
				}
			}
		})
	}
}

// TestMySQLEnqueueWithFoundRows: on a connection that counts found rows
// (go-sql-driver's clientFoundRows), MySQL reports a known key's event
// insert as one affected row with no id. Enqueue still treats the key as
// known: the same content returns the event's rows, other content is
// ErrIdempotencyConflict, and no other event gets rows.
func TestMySQLEnqueueWithFoundRows(t *testing.T) {
	db := testdb.New(t, "mysql")
	db.Store(t) // migrated
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg := mysql.NewConfig()
	cfg.User = u.User.Username()
	cfg.Net, cfg.Addr, cfg.DBName = "tcp", u.Host, strings.TrimPrefix(u.Path, "/")
	cfg.ClientFoundRows = true
	conn, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetMaxOpenConns(1) // every enqueue on the connection of the one before
	store, err := mysqlstore.New(conn)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	ctx := context.Background()
	enqueue := func(key, payload string) (outbox.Enqueued, error) {
		tx, err := conn.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		res, err := store.Enqueue(ctx, outbox.SQLTx(tx), outbox.Event{Stream: "s", Key: key, Kind: "K", Payload: []byte(payload)})
		if err != nil {
			_ = tx.Rollback()
			return res, err
		}
		return res, tx.Commit()
	}
	a, err := enqueue("a", "1")
	if err != nil || !a.Inserted {
		t.Fatalf("first a: %+v, %v", a, err)
	}
	if b, err := enqueue("b", "1"); err != nil || !b.Inserted || b.ID == a.ID {
		t.Fatalf("b: %+v, %v", b, err)
	}
	if again, err := enqueue("a", "1"); err != nil || again.Inserted || again.ID != a.ID {
		t.Fatalf("a again: %+v, %v (first %+v)", again, err, a)
	}
	if _, err := enqueue("a", "2"); !errors.Is(err, outbox.ErrIdempotencyConflict) {
		t.Fatalf("a with other content: %v", err)
	}
	if n := db.Count(t, "SELECT count(*) FROM millpond_deliveries"); n != 2 {
		t.Fatalf("%d delivery rows, want one per event", n)
	}
}
