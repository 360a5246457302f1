// Package anydb opens a millpond outbox Store on whatever database an
// address names: PostgreSQL, MySQL/MariaDB or SQLite. It links all three
// drivers; a program that uses one database imports that driver's package
// (outbox/postgres, outbox/mysql or outbox/sqlite) instead and links only
// it.
package anydb

import (
	"context"
	"fmt"

	"github.com/millpond/millpond/dsn"
	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/outbox/mysql"
	"github.com/millpond/millpond/outbox/postgres"
	"github.com/millpond/millpond/outbox/sqlite"
)

// Open connects to the database an address names and returns a Store that
// owns the connection (Store.Close closes it). The accepted forms are those
// of package dsn:
//
//	postgres://user:pass@host:5432/db?sslmode=disable   (also postgresql://;
//	                                                     pool_max_conns, default 20)
//	host=… user=… password=… dbname=…                   (PostgreSQL key=value)
//	mysql://user:pass@host:3306/db                       (also mariadb://)
//	sqlite:///path/to/file.db  or  sqlite:file.db  or  file:file.db
//
// Anything else is refused with an error wrapping dsn.ErrUnsupported; a
// database that cannot be reached with one wrapping outbox.ErrOpen. No
// error shows the address's password. It does not migrate; call Migrate.
func Open(ctx context.Context, address string, opts ...outbox.Option) (*outbox.Store, error) {
	addr, err := dsn.Parse(address)
	if err != nil {
		return nil, fmt.Errorf("anydb: open: %w", err)
	}
	switch addr.Dialect {
	case dsn.Postgres:
		return postgres.Open(ctx, address, opts...)
	case dsn.MySQL:
		return mysql.Open(ctx, address, opts...)
	default:
		return sqlite.Open(ctx, address, opts...)
	}
}
