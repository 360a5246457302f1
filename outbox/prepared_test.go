package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "modernc.org/sqlite"
)

// openSQLiteStore opens a SQLite database file with the outbox's settings
// (as outbox/sqlite.DSN) and a migrated store over it.
func openSQLiteStore(t *testing.T, path string, conns int) (*sql.DB, *Store) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_pragma=synchronous(FULL)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(conns)
	store, err := NewStore(Backend{Dialect: "sqlite", DB: db})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return db, store
}

// enqueueIn enqueues one event in a transaction of db and commits it.
func enqueueIn(t *testing.T, db *sql.DB, store *Store, key string) Enqueued {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	res, err := store.Enqueue(ctx, SQLTx(tx), Event{Stream: "s", Key: key, Kind: "K", Payload: []byte(`{"k":1}`)})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return res
}

// awaitPrepared enqueues until the store's enqueue statements are
// prepared (in the background, after their first use).
func awaitPrepared(t *testing.T, db *sql.DB, store *Store) {
	t.Helper()
	text := store.core.EnqueueStatements()[0] // the event's INSERT
	for i := 0; ; i++ {
		enqueueIn(t, db, store, fmt.Sprintf("warm-%d", i))
		if store.stmts.entries[text].stmt.Load() != nil {
			return
		}
		if i > 200 {
			t.Fatal("the enqueue's statements were never prepared")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A caller's transaction may come from another *sql.DB than the store's
// (a second pool on the same file): database/sql refuses the store's
// prepared statements there, and the enqueue runs its statements by text.
func TestEnqueuePreparedFallsBackForAnotherDB(t *testing.T) {
	path := filepath.Join(t.TempDir(), "prepared.db")
	db, store := openSQLiteStore(t, path, 4)
	awaitPrepared(t, db, store)

	other, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	first := enqueueIn(t, other, store, "from-other-db")
	if !first.Inserted {
		t.Fatalf("enqueue in another database's transaction: %+v", first)
	}
	again := enqueueIn(t, other, store, "from-other-db") // the known key's lookup
	if again.Inserted || again.ID != first.ID {
		t.Fatalf("enqueue of a known key in another database's transaction: %+v, first %+v", again, first)
	}
	if got := enqueueIn(t, db, store, "from-own-db"); !got.Inserted {
		t.Fatalf("enqueue in the store's database after that: %+v", got)
	}
}

// A prepared statement runs one execution at a time on its connection:
// while its rows are open, the same statement in the same transaction runs
// by text instead, and both results are right.
func TestEnqueuePreparedInUseRunsByText(t *testing.T) {
	ctx := context.Background()
	db, store := openSQLiteStore(t, filepath.Join(t.TempDir(), "busy.db"), 1)
	awaitPrepared(t, db, store)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	ex := withPrepared(SQLTx(tx).ex, store.stmts)
	if _, ok := ex.(preparedTx); !ok {
		t.Fatalf("a database/sql transaction of a SQLite store runs %T, not prepared statements", ex)
	}
	// The sequence upsert of an ordering key: a statement that returns rows.
	var q string
	for _, text := range store.core.EnqueueStatements() {
		if strings.Contains(text, "INSERT INTO millpond_ordering") && strings.Contains(text, "RETURNING last_seq") {
			q = text
		}
	}
	if q == "" {
		t.Fatal("no enqueue statement takes an ordering key's sequence")
	}
	bump := func() (int64, func() error) {
		t.Helper()
		// stream, consumer_group, ordering_key
		rows, err := ex.QueryContext(ctx, q, "s", "", "order-1")
		if err != nil {
			t.Fatalf("take a sequence: %v", err)
		}
		if !rows.Next() {
			t.Fatal("taking a sequence returned no row")
		}
		var seq, unsettled int64
		if err := rows.Scan(&seq, &unsettled); err != nil {
			t.Fatal(err)
		}
		return seq, rows.Close
	}
	seq1, close1 := bump() // the prepared statement, its rows left open
	seq2, close2 := bump()
	if err := close2(); err != nil {
		t.Fatal(err)
	}
	if err := close1(); err != nil {
		t.Fatal(err)
	}
	seq3, close3 := bump() // the prepared statement again
	if err := close3(); err != nil {
		t.Fatal(err)
	}
	if seq1 != 1 || seq2 != 2 || seq3 != 3 {
		t.Fatalf("sequences %d, %d, %d", seq1, seq2, seq3)
	}
}

// The prepared statements survive the schema being dropped and made again
// (SQLite prepares them again), and Close closes them.
func TestEnqueuePreparedAcrossMigrationsAndClose(t *testing.T) {
	ctx := context.Background()
	db, store := openSQLiteStore(t, filepath.Join(t.TempDir(), "schema.db"), 2)
	awaitPrepared(t, db, store)
	if err := store.MigrateDown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if got := enqueueIn(t, db, store, "after-migrations"); !got.Inserted || got.ID != 1 {
		t.Fatalf("enqueue after the schema was made again: %+v", got)
	}
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	for text, p := range store.stmts.entries {
		if p.stmt.Load() != nil {
			t.Fatalf("statement still open after Close: %.40q", text)
		}
	}
}
