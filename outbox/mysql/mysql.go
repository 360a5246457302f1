// Package mysql opens a millpond outbox Store on MySQL 8 or MariaDB 10.6+
// through github.com/go-sql-driver/mysql, which importing it links.
//
//	store, err := mysql.Open(ctx, "mysql://app:secret@db:3306/app")
//	// or, over the application's own *sql.DB (opened with interpolateParams=true):
//	store, err := mysql.New(db)
package mysql

import (
	"context"
	"database/sql"
	"errors"
	"net"
	"net/url"
	"strings"

	driver "github.com/go-sql-driver/mysql"

	"github.com/millpond/millpond/dsn"
	"github.com/millpond/millpond/internal/opening"
	"github.com/millpond/millpond/outbox"
)

// New returns a Store over the application's *sql.DB, which stays the
// caller's to close. Open it with interpolateParams=true for one round trip
// per statement.
func New(db *sql.DB, opts ...outbox.Option) (*outbox.Store, error) {
	return outbox.NewStore(outbox.Backend{Dialect: "mysql", DB: db, Transient: Transient}, opts...)
}

// Open connects to a mysql:// (or mariadb://) URL and returns a Store that
// owns the database (Store.Close closes it). The user and password may hold
// any character (percent-encoded); driver options go in the query. Other
// forms are refused with an error wrapping dsn.ErrUnsupported; a database
// that cannot be reached with one wrapping outbox.ErrOpen. No error shows
// the password. It does not migrate; call Migrate.
func Open(ctx context.Context, address string, opts ...outbox.Option) (*outbox.Store, error) {
	addr, err := opening.Parse("mysql", dsn.MySQL, address)
	if err != nil {
		return nil, err
	}
	source, err := DSN(address)
	if err != nil {
		return nil, opening.Error("mysql", addr, err)
	}
	db, err := opening.SQL(ctx, "mysql", source)
	if err != nil {
		return nil, opening.Error("mysql", addr, err)
	}
	s, err := outbox.NewStore(outbox.Backend{Dialect: "mysql", DB: db, Transient: Transient, Close: db.Close}, opts...)
	if err != nil {
		db.Close()
		return nil, opening.Error("mysql", addr, err)
	}
	return s, nil
}

// DSN turns mysql://user:pass@host:port/db?param=v into the driver's form,
// with client-side parameter interpolation (one round trip a statement)
// unless the URL sets interpolateParams itself.
func DSN(rawURL string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", errors.New("the URL does not parse")
	}
	q := u.Query()
	if !q.Has("interpolateParams") {
		q.Set("interpolateParams", "true")
	}
	cfg, err := driver.ParseDSN("/?" + q.Encode())
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

// Transient reports MySQL's "deadlock found" (1213), "lock wait timeout"
// (1205) and "failed to read auto-increment value" (1467, what InnoDB
// reports for a transaction chosen as a deadlock's victim while it waited
// for a table's auto-increment lock), after which the whole transaction may
// simply be run again.
func Transient(err error) bool {
	var me *driver.MySQLError
	return errors.As(err, &me) && (me.Number == 1213 || me.Number == 1205 || me.Number == 1467)
}
