package sqlcore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
)

// driverDB is a DB whose driver package tells its transient errors (as the
// outbox's driver packages do through Transient).
type driverDB struct {
	DB
	transient func(error) bool
}

func (d driverDB) Transient(err error) bool { return d.transient(err) }

// TestRetryableConflicts: PostgreSQL's deadlocks and serialization failures
// are retried, and so is what the database's driver package calls
// transient; other errors are not.
func TestRetryableConflicts(t *testing.T) {
	mysqlDB := driverDB{transient: func(err error) bool {
		var me *mysql.MySQLError
		return errors.As(err, &me) && (me.Number == 1213 || me.Number == 1205)
	}}
	for err, want := range map[error]bool{
		&pgconn.PgError{Code: "40P01"}:                        true,
		&pgconn.PgError{Code: "40001"}:                        true,
		fmt.Errorf("ack: %w", &pgconn.PgError{Code: "40P01"}): true,
		&mysql.MySQLError{Number: 1213}:                       true,
		&mysql.MySQLError{Number: 1205}:                       true,
		&pgconn.PgError{Code: "23505"}:                        false,
		&mysql.MySQLError{Number: 1062}:                       false,
		errors.New("deadlock"):                                false,
		context.Canceled:                                      false,
	} {
		if got := retryable(mysqlDB, err); got != want {
			t.Errorf("retryable(%v) = %v, want %v", err, got, want)
		}
	}
	// A database without a driver hook retries PostgreSQL's conflicts only.
	if retryable(nil, &mysql.MySQLError{Number: 1213}) || !retryable(nil, &pgconn.PgError{Code: "40P01"}) {
		t.Error("without a Transient method only PostgreSQL's conflicts are retryable")
	}
}

// TestRetryConflictsIsBounded: a conflict is retried with backoff up to
// conflictTries times and reported to the observer each time; another error
// is returned at once.
func TestRetryConflictsIsBounded(t *testing.T) {
	var seen []time.Duration
	c := &Core{onConflict: func(what string, err error, wait time.Duration) { seen = append(seen, wait) }}
	tries := 0
	deadlock := &pgconn.PgError{Code: "40P01"}
	err := c.retryConflicts(context.Background(), "test", func() error { tries++; return deadlock })
	if !errors.Is(err, deadlock) || tries != conflictTries || len(seen) != conflictTries-1 {
		t.Fatalf("endless deadlock: %d tries, %d reported, %v", tries, len(seen), err)
	}
	for i, w := range seen {
		if w <= 0 || w > conflictBackoffMax*3/2 {
			t.Fatalf("wait %d: %s", i, w)
		}
	}
	tries = 0
	err = c.retryConflicts(context.Background(), "test", func() error {
		tries++
		if tries < 3 {
			return deadlock
		}
		return nil
	})
	if err != nil || tries != 3 {
		t.Fatalf("deadlock twice then success: %d tries, %v", tries, err)
	}
	tries = 0
	other := errors.New("syntax error")
	if err := c.retryConflicts(context.Background(), "test", func() error { tries++; return other }); !errors.Is(err, other) || tries != 1 {
		t.Fatalf("other error: %d tries, %v", tries, err)
	}
}
