package tests

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/millpond/millpond/internal/sqlcore"
	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// A new version started against a database its migrations have not
// reached fails at Subscribe with ErrSchemaOutdated, naming what is
// missing, instead of failing every claim; once migrated it subscribes.
// The columns the check wants are exactly those of a freshly migrated
// database.
func TestSchemaCheck(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.New(t, dialect)
			s := unmigratedStore(t, db)
			subscribe := func() error {
				sub, err := outbox.NewSubscriber(s, outbox.SubscriberConfig{})
				if err != nil {
					t.Fatal(err)
				}
				defer sub.Close()
				subCtx, cancel := context.WithCancel(ctx)
				defer cancel()
				_, err = sub.Subscribe(subCtx, "schema")
				return err
			}
			outdated := func(what string, missing ...string) {
				t.Helper()
				err := s.CheckSchema(ctx)
				if !errors.Is(err, outbox.ErrSchemaOutdated) {
					t.Fatalf("%s: CheckSchema = %v, want ErrSchemaOutdated", what, err)
				}
				if empty := what == "empty database"; errors.Is(err, outbox.ErrSchemaNotInstalled) != empty {
					t.Errorf("%s: CheckSchema = %v; wraps ErrSchemaNotInstalled: %v, want %v", what, err, !empty, empty)
				}
				for _, m := range missing {
					if !strings.Contains(err.Error(), m) {
						t.Errorf("%s: %q does not name %s", what, err, m)
					}
				}
				if err := subscribe(); !errors.Is(err, outbox.ErrSchemaOutdated) {
					t.Fatalf("%s: Subscribe = %v, want ErrSchemaOutdated", what, err)
				}
			}

			outdated("empty database", "no millpond tables")
			installVersion3(t, s.SQLDB(), dialect)
			outdated("version 3", "millpond_events.payload", "millpond_deliveries.event_id")
			if err := s.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			if err := s.CheckSchema(ctx); err != nil {
				t.Fatalf("after Migrate: %v", err)
			}
			if err := subscribe(); err != nil {
				t.Fatalf("subscribe after Migrate: %v", err)
			}
			got := columnsOf(t, s.SQLDB(), dialect)
			want := slices.Clone(sqlcore.SchemaColumns[sqlcore.Dialect(dialect)])
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("a freshly migrated database has the columns\n%v\nthe check wants\n%v", got, want)
			}

			if dialect == "mysql" {
				// A database that stopped before migration 0007 (a new
				// schema, its cached check forgotten by MigrateDown).
				if err := s.MigrateDown(ctx); err != nil {
					t.Fatal(err)
				}
				if err := s.Migrate(ctx); err != nil {
					t.Fatal(err)
				}
				migrationScript(t, s.SQLDB(), dialect, "0007_claim_keeps_index.down.sql")
				outdated("before 0007", "millpond_deliveries.phase")
			}
		})
	}
}

func columnsOf(t *testing.T, db *sql.DB, dialect string) []string {
	t.Helper()
	rows, err := db.Query(sqlcore.SchemaColumnsSQL[sqlcore.Dialect(dialect)])
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}
