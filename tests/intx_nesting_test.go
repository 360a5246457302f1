package tests

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/outbox/sqlite"
)

// TestNestedInTxAcrossStores: InTx refuses at once (ErrNestedTransaction) a
// transaction that would wait for the InTx it runs in, on SQLite:
//   - an InTx of a second store over the same SQLite database (they share a
//     write queue and SQLite has one writer): it used to pass the queue on
//     fn's turn and wait in SQLite's busy handler for the outer
//     transaction, held by its own goroutine, until SQLITE_BUSY after 10 s;
//   - an InTx of the same store through an InTx of another store in
//     between: the inner turn hid the outer one, and the nested InTx waited
//     in the queue its own goroutine held, until the context ended.
//
// A store of another database inside an InTx is still a transaction of its
// own, as before.
func TestNestedInTxAcrossStores(t *testing.T) {
	db := testdb.New(t, "sqlite")
	a := db.Store(t)
	b, err := sqlite.New(db.SQL)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	other, err := sqlite.Open(context.Background(), "sqlite:"+filepath.Join(t.TempDir(), "other.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := other.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	nothing := func(context.Context, *sql.Tx) error { return nil }

	start := time.Now()
	var inner error
	if err := a.InTx(ctx, nil, func(ctx context.Context, _ *sql.Tx) error {
		inner = b.InTx(ctx, nil, nothing)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); !errors.Is(inner, outbox.ErrNestedTransaction) || took > time.Second {
		t.Errorf("InTx of a second store over the same SQLite database, inside an InTx: %v after %s, want ErrNestedTransaction at once", inner, took)
	}

	start = time.Now()
	var otherErr error
	if err := a.InTx(ctx, nil, func(ctx context.Context, _ *sql.Tx) error {
		otherErr = other.InTx(ctx, nil, func(ctx context.Context, tx *sql.Tx) error {
			inner = a.InTx(ctx, nil, nothing)
			// The store's own calls with this ctx still pass a's queue.
			_, err := a.Stats(ctx)
			return err
		})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); !errors.Is(inner, outbox.ErrNestedTransaction) || otherErr != nil || took > time.Second {
		t.Errorf("InTx(a) inside InTx(other) inside InTx(a): %v (other's InTx: %v) after %s, want ErrNestedTransaction at once", inner, otherErr, took)
	}
}
