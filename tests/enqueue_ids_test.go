package tests

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
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
// counts: SQLite then reads last_insert_rowid(), MySQL looks the event up).
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
