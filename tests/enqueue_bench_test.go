package tests

import (
	"context"
	"fmt"
	"testing"

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
			db.Exec(b, "CREATE TABLE raw_events (id BIGINT PRIMARY KEY, payload BLOB)")
			if dialect == "postgres" {
				db.Exec(b, "ALTER TABLE raw_events ALTER COLUMN payload TYPE BYTEA")
			}
			payload := make([]byte, 200)
			insert := "INSERT INTO raw_events (id, payload) VALUES (?, ?)"
			if dialect == "postgres" {
				insert = "INSERT INTO raw_events (id, payload) VALUES ($1, $2)"
			}
			b.Run("raw", func(b *testing.B) {
				b.ReportAllocs()
				i := int(db.Count(b, "SELECT COALESCE(MAX(id), 0) FROM raw_events"))
				for b.Loop() {
					i++
					raw, err := db.SQL.BeginTx(ctx, nil)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := raw.ExecContext(ctx, insert, i, payload); err != nil {
						b.Fatal(err)
					}
					if err := raw.Commit(); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("millpond", func(b *testing.B) {
				b.ReportAllocs()
				i := int(db.Count(b, "SELECT count(*) FROM millpond_events"))
				for b.Loop() {
					i++
					raw, err := db.SQL.BeginTx(ctx, nil)
					if err != nil {
						b.Fatal(err)
					}
					ev := outbox.Event{Stream: "s", Key: fmt.Sprintf("e%d", i), Kind: "Thing.Happened", Payload: payload}
					if _, err := store.Enqueue(ctx, outbox.SQLTx(raw), ev); err != nil {
						b.Fatal(err)
					}
					if err := raw.Commit(); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
