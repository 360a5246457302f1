package tests

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// BenchmarkEnqueue measures one enqueue of a 200-byte event per
// transaction (begin, Enqueue, commit) against the same transaction
// holding a raw INSERT of the same bytes into a table with only a primary
// key, on every dialect, one goroutine. The ratio of the two is the
// enqueue's cost over a plain insert without the bench harness's
// concurrency.
//
//	go test ./tests -run '^$' -bench 'Enqueue$' -count 5
func BenchmarkEnqueue(b *testing.B) {
	for _, dialect := range testdb.Dialects {
		b.Run(dialect, func(b *testing.B) {
			db := testdb.New(b, dialect)
			store := db.Store(b)
			ctx := context.Background()
			db.Exec(b, "DROP TABLE IF EXISTS raw_events")
			blob := "BLOB"
			if dialect == "postgres" {
				blob = "BYTEA"
			}
			db.Exec(b, "CREATE TABLE raw_events (id BIGINT PRIMARY KEY, payload "+blob+")")
			payload := make([]byte, 200)
			insert := "INSERT INTO raw_events (id, payload) VALUES (?, ?)"
			if dialect == "postgres" {
				insert = "INSERT INTO raw_events (id, payload) VALUES ($1, $2)"
			}
			// each times one transaction per iteration, fn running inside.
			// (a pgx.Tx on PostgreSQL, a *sql.Tx elsewhere).
			each := func(b *testing.B, first int, fn func(tx any, i int) error) {
				b.ReportAllocs()
				i := first
				for b.Loop() {
					i++
					tx, commit, rollback := db.BeginRaw(b)
					if err := fn(tx, i); err != nil {
						rollback()
						b.Fatal(err)
					}
					if err := commit(); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.Run("raw", func(b *testing.B) {
				each(b, int(db.Count(b, "SELECT COALESCE(MAX(id), 0) FROM raw_events")), func(tx any, i int) error {
					if ptx, ok := tx.(pgx.Tx); ok {
						_, err := ptx.Exec(ctx, insert, i, payload)
						return err
					}
					_, err := tx.(*sql.Tx).ExecContext(ctx, insert, i, payload)
					return err
				})
			})
			b.Run("millpond", func(b *testing.B) {
				each(b, int(db.Count(b, "SELECT count(*) FROM millpond_events")), func(tx any, i int) error {
					ev := outbox.Event{Stream: "s", Key: fmt.Sprintf("e%d", i), Kind: "Thing.Happened", Payload: payload}
					_, err := store.Enqueue(ctx, testdb.Wrap(tx), ev)
					return err
				})
			})
		})
	}
}
