package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// TestPostgresEnqueueNotifiesOnceTheLastNotifyCameBack shows how the
// NOTIFYs of enqueueing transactions are spaced: one committed event after
// another each send a NOTIFY (the next goes as soon as the last has come
// back to the store's listener, however soon), while transactions that
// overlap an outstanding NOTIFY send none. The outstanding NOTIFY is made
// to hold the next one back for an hour, so only its return can let the
// next one go.
func TestPostgresEnqueueNotifiesOnceTheLastNotifyCameBack(t *testing.T) {
	db := testdb.New(t, "postgres")
	store := db.Store(t)
	outbox.SetNotifyStale(store, time.Hour)
	ctx := context.Background()
	// The store's listener connects in the background: a NOTIFY sent
	// before it listens never comes back to it.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, up := store.ListenerStatus(); up {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the store's listener did not connect within 10 s")
		}
	}
	stream := "gate-" + db.Name // notifications reach every listener of the database

	conn, err := pgx.ConnectConfig(ctx, db.Pool.Config().ConnConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "LISTEN millpond_outbox"); err != nil {
		t.Fatal(err)
	}
	// notifications counts this stream's notifications arriving within d.
	notifications := func(d time.Duration) int {
		t.Helper()
		n := 0
		wctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		for {
			got, err := conn.WaitForNotification(wctx)
			if err != nil {
				if wctx.Err() == nil {
					t.Fatal(err)
				}
				return n
			}
			if got.Payload == stream {
				n++
			}
		}
	}
	enqueue := func(tx pgx.Tx, key string) {
		t.Helper()
		if _, err := store.Enqueue(ctx, outbox.PgxTx(tx), outbox.Event{Stream: stream, Key: key, Kind: "k", Payload: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	commitOne := func(key string) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { enqueue(tx, key); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	returned := func() {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for outbox.NotifyOutstanding(store, stream) {
			if time.Now().After(deadline) {
				t.Fatal("the store's listener did not see its NOTIFY come back within 5 s")
			}
			time.Sleep(time.Millisecond)
		}
		time.Sleep(outbox.DefaultNotifyEvery)
	}

	// One committed event after another: each notifies.
	for _, key := range []string{"a", "b", "c"} {
		commitOne(key)
		if n := notifications(time.Second); n != 1 {
			t.Fatalf("event %s: %d notifications, want 1 (the last NOTIFY came back before it was enqueued)", key, n)
		}
		returned()
	}

	// Overlapping transactions: the first one's NOTIFY is outstanding
	// while the second enqueues, so the second sends none.
	first, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback(ctx)
	enqueue(first, "d")
	time.Sleep(2 * outbox.DefaultNotifyEvery)
	commitOne("e")
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := notifications(300 * time.Millisecond); n != 1 {
		t.Fatalf("two overlapping transactions sent %d notifications, want 1", n)
	}
}
