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

// Open connects to the database a URL names and returns a Store that owns
// the connection (Close closes it):
//
//	postgres://user:pass@host:5432/db?sslmode=disable   (also postgresql://;
//	                                                     pool_max_conns, default 20)
//	mysql://user:pass@host:3306/db
//	sqlite:///path/to/file.db  or  sqlite:file.db
//
// It does not migrate; call Migrate.
func Open(ctx context.Context, rawURL string, opts ...Option) (*Store, error) {
	scheme, rest, ok := strings.Cut(rawURL, ":")
	if !ok {
		return nil, fmt.Errorf("outbox: open: %q has no scheme (postgres://, mysql:// or sqlite:)", redactURL(rawURL))
	}
	switch strings.ToLower(scheme) {
	case "postgres", "postgresql":
		config, err := pgxpool.ParseConfig(rawURL)
		if err != nil {
			return nil, fmt.Errorf("outbox: open postgres: %w", err)
		}
		if !strings.Contains(rawURL, "pool_max_conns") {
			// pgxpool's default (the larger of 4 and the CPU count) is too
			// small once every subscription claims, acknowledges and extends
			// leases beside the application's own transactions.
			config.MaxConns = max(config.MaxConns, DefaultPostgresMaxConns)
		}
		pool, err := pgxpool.NewWithConfig(ctx, config)
		if err != nil {
			return nil, fmt.Errorf("outbox: open postgres: %w", err)
		}
		if err := pool.Ping(ctx); err != nil {
			pool.Close()
			return nil, fmt.Errorf("outbox: open postgres: %w", err)
		}
		s, err := NewPostgres(pool, opts...)
		if err != nil {
			pool.Close()
			return nil, err
		}
		s.closer = func() error { pool.Close(); return nil }
		return s, nil
	case "mysql", "mariadb":
		dsn, err := mysqlDSN(rawURL)
		if err != nil {
			return nil, err
		}
		db, err := openSQL(ctx, "mysql", dsn)
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
	case "sqlite", "file":
		path := strings.TrimPrefix(rest, "//")
		if path == "" || strings.Contains(path, ":memory:") || strings.Contains(path, "mode=memory") {
			return nil, errors.New("outbox: open sqlite: give a database file; an in-memory database is private to one connection and would lose every event")
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
	default:
		return nil, fmt.Errorf("outbox: open: unknown scheme %q (want postgres, mysql or sqlite)", scheme)
	}
}

func openSQL(ctx context.Context, driver, dsn string) (*sql.DB, error) {
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return nil, fmt.Errorf("outbox: open %s: %w", driver, err)
	}
	db.SetConnMaxIdleTime(5 * time.Minute)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("outbox: open %s: %w", driver, err)
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
		return "", fmt.Errorf("outbox: open mysql: the URL does not parse (%s)", redactURL(rawURL))
	}
	q := u.Query()
	if !q.Has("interpolateParams") {
		q.Set("interpolateParams", "true")
	}
	cfg, err := mysql.ParseDSN("/?" + q.Encode())
	if err != nil {
		return "", fmt.Errorf("outbox: open mysql: %w", err)
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

// redactURL hides a URL's password.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "[unparseable url]"
	}
	return u.Redacted()
}
