package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "modernc.org/sqlite" // the embedded default dialect

	"github.com/millpond/millpond/dsn"
)

// DefaultPostgresMaxConns is the pool size Open gives a PostgreSQL pool
// whose URL sets no pool_max_conns.
const DefaultPostgresMaxConns = 20

// SQLiteDSN returns a modernc.org/sqlite data source name for a database
// file with the settings the outbox relies on: WAL journal, a 10 s busy
// timeout, full fsync on commit and BEGIN IMMEDIATE transactions, so a
// writer never fails to upgrade its lock.
//
// Query parameters already on path (file.db?mode=rw) are kept.
func SQLiteDSN(path string) string {
	sep := "?"
	if strings.Contains(path, "?") {
		sep = "&"
	}
	return "file:" + path + sep + "_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_pragma=synchronous(FULL)&_pragma=foreign_keys(1)&_txlock=immediate"
}

// Open connects to the database an address names and returns a Store that
// owns the connection (Close closes it). The accepted forms are those of
// package dsn:
//
//	postgres://user:pass@host:5432/db?sslmode=disable   (also postgresql://;
//	                                                     pool_max_conns, default 20)
//	host=… user=… password=… dbname=…                   (PostgreSQL key=value)
//	mysql://user:pass@host:3306/db                       (also mariadb://)
//	sqlite:///path/to/file.db  or  sqlite:file.db  or  file:file.db
//
// Anything else is refused with an error wrapping dsn.ErrUnsupported. No
// error shows the address's password. It does not migrate; call Migrate.
func Open(ctx context.Context, address string, opts ...Option) (*Store, error) {
	addr, err := dsn.Parse(address)
	if err != nil {
		return nil, fmt.Errorf("outbox: open: %w", err)
	}
	s, err := openAddress(ctx, addr, opts)
	if err != nil {
		// A driver may echo what it was given; never let a password through.
		return nil, &openError{
			text: fmt.Sprintf("outbox: open %s %s: %s", addr.Dialect, addr, addr.Scrub(err.Error())),
			err:  err,
		}
	}
	return s, nil
}

// ErrOpen is wrapped by Open's errors when the database could not be
// reached or its driver refused the address.
var ErrOpen = errors.New("could not open the database")

// openError is a driver's error with the address's password scrubbed from
// its text; errors.Is and errors.As still see ErrOpen and the driver's
// error.
type openError struct {
	text string
	err  error
}

func (e *openError) Error() string   { return e.text }
func (e *openError) Unwrap() []error { return []error{ErrOpen, e.err} }

func openAddress(ctx context.Context, addr dsn.Address, opts []Option) (*Store, error) {
	raw := addr.Raw()
	switch addr.Dialect {
	case dsn.Postgres:
		config, err := pgxpool.ParseConfig(raw)
		if err != nil {
			return nil, err
		}
		if !strings.Contains(raw, "pool_max_conns") {
			// pgxpool's default (the larger of 4 and the CPU count) is too
			// small once every subscription claims, acknowledges and extends
			// leases beside the application's own transactions.
			config.MaxConns = max(config.MaxConns, DefaultPostgresMaxConns)
		}
		pool, err := pgxpool.NewWithConfig(ctx, config)
		if err != nil {
			return nil, err
		}
		if err := pool.Ping(ctx); err != nil {
			pool.Close()
			return nil, err
		}
		s, err := NewPostgres(pool, opts...)
		if err != nil {
			pool.Close()
			return nil, err
		}
		s.closer = func() error { pool.Close(); return nil }
		return s, nil
	case dsn.MySQL:
		cfg, err := mysqlDSN(raw)
		if err != nil {
			return nil, err
		}
		db, err := openSQL(ctx, "mysql", cfg)
		if err != nil {
			return nil, err
		}
		s, err := NewMySQL(db, opts...)
		if err != nil {
			db.Close()
			return nil, err
		}
		s.closer = db.Close
		return s, nil
	default:
		path := addr.Path
		if strings.Contains(path, ":memory:") || strings.Contains(path, "mode=memory") {
			return nil, errors.New("give a database file; an in-memory database is private to one connection and would lose every event")
		}
		db, err := openSQL(ctx, "sqlite", SQLiteDSN(path))
		if err != nil {
			return nil, err
		}
		s, err := NewSQLite(db, opts...)
		if err != nil {
			db.Close()
			return nil, err
		}
		s.closer = db.Close
		return s, nil
	}
}

func openSQL(ctx context.Context, driver, source string) (*sql.DB, error) {
	db, err := sql.Open(driver, source)
	if err != nil {
		return nil, err
	}
	db.SetConnMaxIdleTime(5 * time.Minute)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

// mysqlDSN turns mysql://user:pass@host:port/db?param=v into the driver's
// form, with client-side parameter interpolation (one round trip a
// statement) unless the URL sets interpolateParams itself. Driver options
// in the query are parsed by the driver; user and password may hold any
// character.
func mysqlDSN(rawURL string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", errors.New("the URL does not parse")
	}
	q := u.Query()
	if !q.Has("interpolateParams") {
		q.Set("interpolateParams", "true")
	}
	cfg, err := mysql.ParseDSN("/?" + q.Encode())
	if err != nil {
		return "", err
	}
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	cfg.Net = "tcp"
	port := u.Port()
	if port == "" {
		port = "3306"
	}
	cfg.Addr = net.JoinHostPort(u.Hostname(), port)
	cfg.DBName = strings.TrimPrefix(u.Path, "/")
	return cfg.FormatDSN(), nil
}
