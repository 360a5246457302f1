// Package sqlite opens a millpond outbox Store on an embedded SQLite
// database through modernc.org/sqlite (pure Go, no cgo), which importing it
// links.
//
//	store, err := sqlite.Open(ctx, "sqlite:app.db")
//	// or, over the application's own *sql.DB (opened with DSN(path)):
//	store, err := sqlite.New(db)
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"strings"

	driver "modernc.org/sqlite"

	"github.com/millpond/millpond/dsn"
	"github.com/millpond/millpond/internal/opening"
	"github.com/millpond/millpond/outbox"
)

// DriverName is the database/sql driver name modernc.org/sqlite registers.
const DriverName = "sqlite"

// DSN returns a data source name for a database file with the settings the
// outbox relies on: WAL journal, a 10 s busy timeout, full fsync on commit
// and BEGIN IMMEDIATE transactions, so a writer never fails to upgrade its
// lock. Query parameters already on path (file.db?mode=rw) are kept.
func DSN(path string) string {
	sep := "?"
	if strings.Contains(path, "?") {
		sep = "&"
	}
	return "file:" + path + sep + "_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_pragma=synchronous(FULL)&_pragma=foreign_keys(1)&_txlock=immediate"
}

// New returns a Store over the application's *sql.DB, which stays the
// caller's to close. Open it with sql.Open(DriverName, DSN(path)).
func New(db *sql.DB, opts ...outbox.Option) (*outbox.Store, error) {
	return outbox.NewStore(outbox.Backend{Dialect: "sqlite", DB: db, Transient: Transient}, opts...)
}

// Open opens sqlite:path (also sqlite:///abs/path or file:path) and returns
// a Store that owns the database (Store.Close closes it). An in-memory
// database is refused: it is private to one connection and would lose
// every event. Other forms are refused with an error wrapping
// dsn.ErrUnsupported; a file that cannot be opened with one wrapping
// outbox.ErrOpen. It does not migrate; call Migrate.
func Open(ctx context.Context, address string, opts ...outbox.Option) (*outbox.Store, error) {
	addr, err := opening.Parse("sqlite", dsn.SQLite, address)
	if err != nil {
		return nil, err
	}
	if strings.Contains(addr.Path, ":memory:") || strings.Contains(addr.Path, "mode=memory") {
		return nil, opening.Error("sqlite", addr, errors.New("give a database file; an in-memory database is private to one connection and would lose every event"))
	}
	db, err := opening.SQL(ctx, DriverName, DSN(addr.Path))
	if err != nil {
		return nil, opening.Error("sqlite", addr, err)
	}
	s, err := outbox.NewStore(outbox.Backend{Dialect: "sqlite", DB: db, Transient: Transient, Close: db.Close}, opts...)
	if err != nil {
		db.Close()
		return nil, opening.Error("sqlite", addr, err)
	}
	return s, nil
}

// Transient reports SQLite's "database is locked" (SQLITE_BUSY and its
// extended codes) after the busy timeout, after which the whole transaction
// may simply be run again.
func Transient(err error) bool {
	var se *driver.Error
	return errors.As(err, &se) && se.Code()&0xff == 5
}
