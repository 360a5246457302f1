// Package testdb gives tests an isolated, migrated outbox store on a real
// database: a fresh PostgreSQL schema, a fresh MySQL/MariaDB database or a
// fresh SQLite file per test, dropped when the test ends.
//
// Servers come from MILLPOND_POSTGRES_URL and MILLPOND_MYSQL_URL (defaults:
// the local servers on their standard ports). When a server cannot be
// reached the test is skipped with the reason, unless
// MILLPOND_REQUIRE_DATABASES=1 (set by CI), which turns the skip into a
// failure.
package testdb

import (
	mysqlstore "github.com/millpond/millpond/outbox/mysql"
	"github.com/millpond/millpond/outbox/postgres"
	"github.com/millpond/millpond/outbox/sqlite"

	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millpond/millpond/outbox"
)

// Dialects lists every dialect the conformance tests run against.
var Dialects = []string{"postgres", "mysql", "sqlite"}

// PostgresURL is the server tests use for PostgreSQL.
func PostgresURL() string {
	return env("MILLPOND_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
}

// MySQLURL is the server tests use for MySQL or MariaDB.
func MySQLURL() string { return env("MILLPOND_MYSQL_URL", "mysql://root@127.0.0.1:3306/test") }

// Required reports whether missing databases fail tests instead of skipping.
func Required() bool { return os.Getenv("MILLPOND_REQUIRE_DATABASES") == "1" }

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

var seq atomic.Int64

// unavailable skips or fails the test when a server is not reachable.
func unavailable(t testing.TB, dialect string, err error) {
	t.Helper()
	msg := fmt.Sprintf("%s server not reachable (%v); set MILLPOND_%s_URL or start the server", dialect, err, strings.ToUpper(dialect))
	if Required() {
		t.Fatalf("%s, and MILLPOND_REQUIRE_DATABASES=1 forbids skipping", msg)
	}
	t.Skip(msg)
}

// Database is an isolated database for one test.
type Database struct {
	// Dialect is "postgres", "mysql" or "sqlite".
	Dialect string
	// Name is the schema, database or file name; on PostgreSQL it is also
	// the connections' application_name.
	Name string
	// URL opens the isolated database with anydb.Open.
	URL string
	// SQL is a database/sql handle for MySQL and SQLite (nil for PostgreSQL).
	SQL *sql.DB
	// Pool is a pgx pool for PostgreSQL (nil otherwise).
	Pool *pgxpool.Pool
}

// New creates an isolated database of the dialect, dropped at cleanup.
func New(t testing.TB, dialect string) *Database {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	name := fmt.Sprintf("mp_%d_%d_%s", os.Getpid(), seq.Add(1), strings.ReplaceAll(uuid.NewString()[:8], "-", ""))
	switch dialect {
	case "postgres":
		admin, err := pgxpool.New(ctx, PostgresURL())
		if err == nil {
			err = admin.Ping(ctx)
		}
		if err != nil {
			unavailable(t, dialect, err)
		}
		if _, err := admin.Exec(ctx, "CREATE SCHEMA "+name); err != nil {
			t.Fatalf("create schema: %v", err)
		}
		u, _ := url.Parse(PostgresURL())
		q := u.Query()
		q.Set("search_path", name)
		q.Set("application_name", name)
		u.RawQuery = q.Encode()
		pool, err := pgxpool.New(ctx, u.String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			pool.Close()
			_, _ = admin.Exec(context.Background(), "DROP SCHEMA "+name+" CASCADE")
			admin.Close()
		})
		return &Database{Dialect: dialect, Name: name, URL: u.String(), Pool: pool}
	case "mysql":
		adminURL := MySQLURL()
		admin, err := openMySQL(adminURL)
		if err == nil {
			err = admin.PingContext(ctx)
		}
		if err != nil {
			unavailable(t, dialect, err)
		}
		if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
			t.Fatalf("create database: %v", err)
		}
		u, _ := url.Parse(adminURL)
		u.Path = "/" + name
		db, err := openMySQL(u.String())
		if err != nil {
			t.Fatal(err)
		}
		db.SetMaxOpenConns(40)
		t.Cleanup(func() {
			db.Close()
			_, _ = admin.ExecContext(context.Background(), "DROP DATABASE "+name)
			admin.Close()
		})
		return &Database{Dialect: dialect, Name: name, URL: u.String(), SQL: db}
	case "sqlite":
		path := filepath.Join(t.TempDir(), name+".db")
		db, err := sql.Open("sqlite", sqlite.DSN(path))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return &Database{Dialect: dialect, Name: name, URL: "sqlite:" + path, SQL: db}
	}
	t.Fatalf("unknown dialect %q", dialect)
	return nil
}

func openMySQL(rawURL string) (*sql.DB, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	cfg := mysql.NewConfig()
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	cfg.Net, cfg.Addr, cfg.DBName = "tcp", u.Host, strings.TrimPrefix(u.Path, "/")
	cfg.InterpolateParams = true
	return sql.Open("mysql", cfg.FormatDSN())
}

// Store returns a migrated store over the database.
func (d *Database) Store(t testing.TB, opts ...outbox.Option) *outbox.Store {
	t.Helper()
	var s *outbox.Store
	var err error
	switch d.Dialect {
	case "postgres":
		s, err = postgres.New(d.Pool, opts...)
	case "mysql":
		s, err = mysqlstore.New(d.SQL, opts...)
	default:
		s, err = sqlite.New(d.SQL, opts...)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return s
}

// Begin opens a transaction of the caller's kind (pgx.Tx on PostgreSQL,
// *sql.Tx elsewhere) as an outbox.Tx. commit and rollback end it.
func (d *Database) Begin(t testing.TB) (tx outbox.Tx, commit func() error, rollback func()) {
	t.Helper()
	raw, commit, rollback := d.BeginRaw(t)
	return Wrap(raw), commit, rollback
}

// BeginRaw is Begin for tests that also write through the transaction
// themselves: it returns the pgx.Tx or *sql.Tx.
func (d *Database) BeginRaw(t testing.TB) (tx any, commit func() error, rollback func()) {
	t.Helper()
	tx, commit, rollback, err := d.TryBeginRaw()
	if err != nil {
		t.Fatal(err)
	}
	return tx, commit, rollback
}

// TryBegin is Begin for goroutines other than the test's: it returns the
// error instead of failing the test.
func (d *Database) TryBegin() (tx outbox.Tx, commit func() error, rollback func(), err error) {
	raw, commit, rollback, err := d.TryBeginRaw()
	if err != nil {
		return outbox.Tx{}, nil, nil, err
	}
	return Wrap(raw), commit, rollback, nil
}

// TryBeginRaw is BeginRaw for goroutines other than the test's.
func (d *Database) TryBeginRaw() (tx any, commit func() error, rollback func(), err error) {
	ctx := context.Background()
	if d.Pool != nil {
		ptx, err := d.Pool.Begin(ctx)
		if err != nil {
			return nil, nil, nil, err
		}
		return ptx, func() error { return ptx.Commit(ctx) }, func() { _ = ptx.Rollback(ctx) }, nil
	}
	stx, err := d.SQL.BeginTx(ctx, nil)
	if err != nil {
		return nil, nil, nil, err
	}
	return stx, stx.Commit, func() { _ = stx.Rollback() }, nil
}

// Wrap makes a pgx.Tx or *sql.Tx into an outbox.Tx.
func Wrap(raw any) outbox.Tx {
	switch tx := raw.(type) {
	case pgx.Tx:
		return outbox.PgxTx(tx)
	case *sql.Tx:
		return outbox.SQLTx(tx)
	default:
		panic(fmt.Sprintf("testdb: %T is not a transaction", raw))
	}
}

// Exec runs a statement outside the outbox, for tests that inspect or
// tamper with rows directly.
func (d *Database) Exec(t testing.TB, query string, args ...any) {
	t.Helper()
	var err error
	if d.Pool != nil {
		_, err = d.Pool.Exec(context.Background(), query, args...)
	} else {
		_, err = d.SQL.Exec(query, args...)
	}
	if err != nil {
		t.Fatalf("exec %q: %v", query, err)
	}
}

// Count returns the integer result of a single-value query.
func (d *Database) Count(t testing.TB, query string, args ...any) int64 {
	t.Helper()
	var n int64
	var err error
	if d.Pool != nil {
		err = d.Pool.QueryRow(context.Background(), query, args...).Scan(&n)
	} else {
		err = d.SQL.QueryRow(query, args...).Scan(&n)
	}
	if err != nil {
		t.Fatalf("query %q: %v", query, err)
	}
	return n
}

// WithPassword returns the PostgreSQL database's address with a password
// added, in URL form and in key=value form, for tests that check a
// password never reaches output. The local server's trust authentication
// ignores the password, so both addresses open the database.
func (d *Database) WithPassword(t testing.TB, password string) (urlForm, keywordForm string) {
	t.Helper()
	if d.Dialect != "postgres" {
		t.Fatalf("WithPassword: %s database; want postgres", d.Dialect)
	}
	u, err := url.Parse(d.URL)
	if err != nil {
		t.Fatal(err)
	}
	keywordForm = fmt.Sprintf("host=%s port=%s user=%s password=%s dbname=%s search_path=%s sslmode=disable",
		u.Hostname(), u.Port(), u.User.Username(), password, strings.TrimPrefix(u.Path, "/"), u.Query().Get("search_path"))
	u.User = url.UserPassword(u.User.Username(), password)
	return u.String(), keywordForm
}
