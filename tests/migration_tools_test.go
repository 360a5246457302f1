package tests

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/database"
	migratemysql "github.com/golang-migrate/migrate/v4/database/mysql"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	migratesqlite "github.com/golang-migrate/migrate/v4/database/sqlite"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
	mysqlstore "github.com/millpond/millpond/outbox/mysql"
	"github.com/millpond/millpond/outbox/postgres"
	"github.com/millpond/millpond/outbox/sqlite"
)

// goose runs outbox.GooseMigrationsFS on every database, up and down and up
// again, and the Store works on the schema it installs; Store.Migrate then
// adopts that schema without losing events (the switch from a tool to
// Store.Migrate that outbox.MigrationsFS documents).
func TestGooseRunsGooseMigrationsFS(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.New(t, dialect)
			s := unmigratedStore(t, db)
			want := migrationVersions(t, dialect)
			fsys, err := outbox.GooseMigrationsFS(dialect)
			if err != nil {
				t.Fatal(err)
			}
			gooseDialect := map[string]goose.Dialect{"postgres": goose.DialectPostgres, "mysql": goose.DialectMySQL, "sqlite": goose.DialectSQLite3}[dialect]
			// The provider is not closed: Close would close the store's
			// database handle.
			p, err := goose.NewProvider(gooseDialect, s.SQLDB(), fsys)
			if err != nil {
				t.Fatalf("goose.NewProvider: %v", err)
			}
			up := func() {
				t.Helper()
				results, err := p.Up(ctx)
				if err != nil {
					t.Fatalf("goose up: %v", err)
				}
				var got []int64
				for _, r := range results {
					got = append(got, r.Source.Version)
				}
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("goose applied versions %v, want %v", got, want)
				}
				if v, err := p.GetDBVersion(ctx); err != nil || v != want[len(want)-1] {
					t.Fatalf("goose version after up: %d, %v", v, err)
				}
				if n := millpondTables(t, s); n != 3 {
					t.Fatalf("goose up made %d millpond tables, want the events, the deliveries and the subscriptions", n)
				}
			}

			up()
			roundTrip(t, s, "after-goose-up")

			if _, err := p.DownTo(ctx, 0); err != nil {
				t.Fatalf("goose down: %v", err)
			}
			if v, err := p.GetDBVersion(ctx); err != nil || v != 0 {
				t.Fatalf("goose version after down: %d, %v", v, err)
			}
			if n := millpondTables(t, s); n != 0 {
				t.Fatalf("goose down left %d millpond tables", n)
			}

			up()
			id := enqueueOne(t, s, "before-store-migrate")
			if err := s.Migrate(ctx); err != nil {
				t.Fatalf("Store.Migrate over goose's schema: %v", err)
			}
			var recorded int
			if err := s.SQLDB().QueryRowContext(ctx, "SELECT COUNT(*) FROM millpond_schema_migrations").Scan(&recorded); err != nil {
				t.Fatal(err)
			}
			if recorded != len(want) {
				t.Fatalf("Store.Migrate recorded %d versions, want %d", recorded, len(want))
			}
			claimAndAck(t, s, id)
			roundTrip(t, s, "after-store-migrate")
		})
	}
}

// golang-migrate runs outbox.MigrationsFS through its iofs source on every
// database, up and down, and the Store works on the schema it installs.
func TestGolangMigrateRunsMigrationsFS(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, dialect)
			s := unmigratedStore(t, db)
			want := migrationVersions(t, dialect)
			fsys, err := outbox.MigrationsFS(dialect)
			if err != nil {
				t.Fatal(err)
			}
			src, err := iofs.New(fsys, ".")
			if err != nil {
				t.Fatalf("iofs.New: %v", err)
			}
			// m.Close closes this handle, so it is golang-migrate's own.
			handle := migrateHandle(t, db)
			var drv database.Driver
			switch dialect {
			case "postgres":
				drv, err = migratepgx.WithInstance(handle, &migratepgx.Config{})
			case "mysql":
				drv, err = migratemysql.WithInstance(handle, &migratemysql.Config{})
			default:
				drv, err = migratesqlite.WithInstance(handle, &migratesqlite.Config{})
			}
			if err != nil {
				t.Fatalf("golang-migrate driver: %v", err)
			}
			m, err := migrate.NewWithInstance("iofs", src, dialect, drv)
			if err != nil {
				t.Fatalf("migrate.NewWithInstance: %v", err)
			}
			t.Cleanup(func() { m.Close() })

			if err := m.Up(); err != nil {
				t.Fatalf("golang-migrate up: %v", err)
			}
			v, dirty, err := m.Version()
			if err != nil || dirty || int64(v) != want[len(want)-1] {
				t.Fatalf("golang-migrate version after up: %d dirty=%v, %v", v, dirty, err)
			}
			if n := millpondTables(t, s); n != 3 {
				t.Fatalf("golang-migrate up made %d millpond tables, want 3", n)
			}
			roundTrip(t, s, "after-migrate-up")

			if err := m.Down(); err != nil {
				t.Fatalf("golang-migrate down: %v", err)
			}
			if n := millpondTables(t, s); n != 0 {
				t.Fatalf("golang-migrate down left %d millpond tables", n)
			}
		})
	}
}

// unmigratedStore opens a Store over the test database without migrating.
func unmigratedStore(t *testing.T, db *testdb.Database, opts ...outbox.Option) *outbox.Store {
	t.Helper()
	var s *outbox.Store
	var err error
	switch db.Dialect {
	case "postgres":
		s, err = postgres.New(db.Pool, append([]outbox.Option{outbox.WithoutListen()}, opts...)...)
	case "mysql":
		s, err = mysqlstore.New(db.SQL, opts...)
	default:
		s, err = sqlite.New(db.SQL, opts...)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// migrateHandle opens a second database/sql handle on the test database
// for golang-migrate, which closes it. MySQL needs multiStatements for
// migration files that hold several statements.
func migrateHandle(t *testing.T, db *testdb.Database) *sql.DB {
	t.Helper()
	switch db.Dialect {
	case "postgres":
		return stdlib.OpenDBFromPool(db.Pool)
	case "mysql":
		u, err := url.Parse(db.URL)
		if err != nil {
			t.Fatal(err)
		}
		cfg := mysql.NewConfig()
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
		cfg.Net, cfg.Addr, cfg.DBName = "tcp", u.Host, strings.TrimPrefix(u.Path, "/")
		cfg.MultiStatements = true
		h, err := sql.Open("mysql", cfg.FormatDSN())
		if err != nil {
			t.Fatal(err)
		}
		return h
	default:
		h, err := sql.Open("sqlite", sqlite.DSN(strings.TrimPrefix(db.URL, "sqlite:")))
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
}

func migrationVersions(t *testing.T, dialect string) []int64 {
	t.Helper()
	ms, err := outbox.Migrations(dialect)
	if err != nil || len(ms) == 0 {
		t.Fatalf("Migrations(%s): %v, %v", dialect, ms, err)
	}
	var out []int64
	for _, m := range ms {
		out = append(out, int64(m.Version))
	}
	return out
}

// millpondTables counts the outbox's own tables (not the tools' version
// tables, nor millpond_schema_migrations, which only Store.Migrate makes):
// the events, their delivery rows and the subscriptions (millpond_outbox is
// a view since migration 0004).
func millpondTables(t *testing.T, s *outbox.Store) int {
	t.Helper()
	q := map[string]string{
		"postgres": "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' AND table_name IN ('millpond_events', 'millpond_deliveries', 'millpond_subscriptions')",
		"mysql":    "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_type = 'BASE TABLE' AND table_name IN ('millpond_events', 'millpond_deliveries', 'millpond_subscriptions')",
		"sqlite":   "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name IN ('millpond_events', 'millpond_deliveries', 'millpond_subscriptions')",
	}[s.Dialect()]
	var n int
	if err := s.SQLDB().QueryRow(q).Scan(&n); err != nil {
		t.Fatalf("count tables: %v", err)
	}
	return n
}

// roundTrip enqueues one event in a *sql.Tx, claims it and acknowledges it.
func roundTrip(t *testing.T, s *outbox.Store, key string) {
	t.Helper()
	claimAndAck(t, s, enqueueOne(t, s, key))
}

func enqueueOne(t *testing.T, s *outbox.Store, key string) int64 {
	t.Helper()
	ctx := context.Background()
	var tx *sql.Tx
	tx, err := s.SQLDB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	res, err := s.Enqueue(ctx, outbox.SQLTx(tx), outbox.Event{Stream: "tools", Key: key, Kind: "Checked", Payload: []byte(`{}`)})
	if err != nil || !res.Inserted {
		t.Fatalf("enqueue %s: %+v, %v", key, res, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return res.ID
}

func claimAndAck(t *testing.T, s *outbox.Store, id int64) {
	t.Helper()
	ctx := context.Background()
	claimed, err := s.Claim(ctx, outbox.ClaimRequest{Stream: "tools", Worker: "tools-test", Limit: 10, Lease: time.Minute, MaxAttempts: 3})
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	if len(claimed) != 1 || claimed[0].ID != id {
		t.Fatalf("claimed %v, want event %d alone", claimed, id)
	}
	if err := s.Acknowledge(ctx, claimed[0].Receipt()); err != nil {
		t.Fatalf("acknowledge: %v", err)
	}
}
