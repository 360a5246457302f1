// Package opening holds what the driver packages' Open functions share: the
// check that an address names their dialect, and errors whose text never
// shows the address's password.
package opening

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/millpond/millpond/dsn"
	"github.com/millpond/millpond/outbox"
)

// Parse checks that address is well formed and names the dialect want.
func Parse(pkg string, want dsn.Dialect, address string) (dsn.Address, error) {
	addr, err := dsn.Parse(address)
	if err != nil {
		return dsn.Address{}, fmt.Errorf("%s: open: %w", pkg, err)
	}
	if addr.Dialect != want {
		return dsn.Address{}, fmt.Errorf("%s: open: %w: the address names a %s database, not %s (anydb.Open opens any)", pkg, dsn.ErrUnsupported, addr.Dialect, want)
	}
	return addr, nil
}

// Error reports a failure to open addr. Its text names the redacted
// address and has the password scrubbed from the driver's message (a
// driver may echo what it was given); errors.Is and errors.As still reach
// outbox.ErrOpen and the driver's error.
func Error(pkg string, addr dsn.Address, err error) error {
	return &openError{
		text: fmt.Sprintf("%s: open %s: %s", pkg, addr, addr.Scrub(err.Error())),
		err:  err,
	}
}

type openError struct {
	text string
	err  error
}

func (e *openError) Error() string   { return e.text }
func (e *openError) Unwrap() []error { return []error{outbox.ErrOpen, e.err} }

// SQL opens and pings a database/sql handle.
func SQL(ctx context.Context, driver, source string) (*sql.DB, error) {
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
