package mysql

import (
	"errors"
	"fmt"
	"testing"

	driver "github.com/go-sql-driver/mysql"
)

// TestTransient: InnoDB's deadlock (also as a failed auto-increment read)
// and lock wait timeout are transient, so
// the store runs the aborted transaction again; other errors are not.
func TestTransient(t *testing.T) {
	for err, want := range map[error]bool{
		&driver.MySQLError{Number: 1213}:                        true,
		&driver.MySQLError{Number: 1205}:                        true,
		&driver.MySQLError{Number: 1467}:                        true,
		fmt.Errorf("ack: %w", &driver.MySQLError{Number: 1213}): true,
		&driver.MySQLError{Number: 1062}:                        false,
		errors.New("Error 1213: deadlock"):                      false,
	} {
		if got := Transient(err); got != want {
			t.Errorf("Transient(%v) = %v, want %v", err, got, want)
		}
	}
}
