package tests

import (
	"context"
	"database/sql"
	"net/url"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/millpond/millpond/bus"
	"github.com/millpond/millpond/handlers"
	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
	mysqlstore "github.com/millpond/millpond/outbox/mysql"
)

// mysqlAdmin opens a connection pool to the MySQL/MariaDB server's own
// test database, outside the isolated database whose connections a test
// kills.
func mysqlAdmin(t *testing.T) *sql.DB {
	t.Helper()
	source, err := mysqlstore.DSN(testdb.MySQLURL())
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("mysql", source)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	return db
}

// killMySQLConnections kills every connection whose default database is
// name (the isolated test database: never another test's) but the
// caller's, and returns how many it killed.
func killMySQLConnections(admin *sql.DB, name string) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rows, err := admin.QueryContext(ctx, `SELECT ID FROM information_schema.PROCESSLIST WHERE DB = ? AND ID <> CONNECTION_ID()`, name)
	if err != nil {
		return 0
	}
	var ids []int64
	for rows.Next() {
		var id int64
		if rows.Scan(&id) == nil {
			ids = append(ids, id)
		}
	}
	rows.Close()
	var n int64
	for _, id := range ids {
		// The connection may have ended meanwhile (unknown thread id).
		if _, err := admin.ExecContext(ctx, "KILL CONNECTION "+strconv.FormatInt(id, 10)); err == nil {
			n++
		}
	}
	return n
}

// TestSubscriberSurvivesKilledMySQLConnections: while the Subscriber's own
// MariaDB/MySQL connections are killed over and over (KILL CONNECTION, as
// an administrator or a failover does), every event is still delivered and
// acknowledged, and an event whose ack was written is not delivered again:
// in particular an acknowledgement whose transaction did not commit hands
// no next event of an ordering key over (the key's next event stays
// claimable, and would be delivered twice). A kill meets an
// acknowledgement's commit now and then, not every time: the ordered case
// runs up to three rounds.
func TestSubscriberSurvivesKilledMySQLConnections(t *testing.T) {
	for _, ordered := range []bool{false, true} {
		t.Run("ordered="+strconv.FormatBool(ordered), func(t *testing.T) {
			e := newEnv(t, "mysql", false)
			admin := mysqlAdmin(t)
			rounds := 1
			if ordered {
				rounds = 3
			}
			for round := range rounds {
				deliverWhileKilling(t, e, "kill-"+strconv.Itoa(round), ordered, killing{
					every: 50 * time.Millisecond, timeout: 40 * time.Second, handle: 20 * time.Millisecond,
					kill: func() int64 { return killMySQLConnections(admin, e.db.Name) },
					cfg:  outbox.SubscriberConfig{Lease: 3 * time.Second, PollInterval: 10 * time.Millisecond},
				})
			}
		})
	}
}

// frozenMySQL is an isolated MariaDB/MySQL database and a store that
// reaches it through a freezeProxy (e reaches it directly).
type frozenMySQL struct {
	*env
	proxy *freezeProxy
	store *outbox.Store
}

func newFrozenMySQL(t *testing.T) *frozenMySQL {
	t.Helper()
	e := newEnv(t, "mysql", false)
	u, err := url.Parse(e.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newFreezeProxy(t, u.Host)
	store, err := mysqlstore.Open(context.Background(), proxy.via(t, e.db.URL), outbox.WithoutListen())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	t.Cleanup(proxy.unfreeze)
	return &frozenMySQL{env: e, proxy: proxy, store: store}
}

// TestMySQLSubscriberCloseWithFrozenDatabase: a Subscriber closed while its
// MariaDB/MySQL server does not answer returns after its statements'
// bounds, and so does closing the store.
func TestMySQLSubscriberCloseWithFrozenDatabase(t *testing.T) {
	f := newFrozenMySQL(t)
	const n = frozenEvents
	acked := closeLeasedWhileFrozen(t, f.env, f.store, f.proxy)
	within(t, 10*time.Second, "Store.Close", func() { _ = f.store.Close() })

	// Thawed, every event is delivered: nothing was lost.
	f.proxy.unfreeze()
	f.db.Exec(t, "UPDATE millpond_deliveries SET available_at = 0 WHERE status = 'processing'")
	_, msgs2 := subscribe(t, f.s, outbox.SubscriberConfig{MaxInFlight: 16, BatchSize: 200}, "frozen")
	counter := countDeliveries(msgs2, 16, n-acked, 0)
	select {
	case <-counter.all:
	case <-time.After(30 * time.Second):
		seen, _ := counter.result()
		t.Fatalf("after thawing %d of %d unacknowledged events delivered", len(seen), n-acked)
	}
}

// TestMySQLBusStopWithFrozenDatabase: a bus stopped while its MariaDB/MySQL
// server does not answer, with a handler running and events claimed,
// returns within its bounds.
func TestMySQLBusStopWithFrozenDatabase(t *testing.T) {
	f := newFrozenMySQL(t)
	const n = 300
	var handled atomic.Int64
	release := make(chan struct{})
	h := handlers.New("frozen-handler", "frozen", "Reliability", func(ctx context.Context, _ any, _ handlers.Meta) error {
		if handled.Add(1) > 20 {
			<-release
		}
		return nil
	})
	b, err := bus.New(f.store, bus.Config{
		Subscriber: outbox.SubscriberConfig{Lease: 9 * time.Second, BatchSize: 100, PollInterval: 10 * time.Millisecond, CloseTimeout: 500 * time.Millisecond},
	}, h)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Enqueued once the handler's group is registered.
	enqueueMany(t, f.db, f.s, "frozen", "ev", n)
	waitFor(t, "handlers to run", func() bool { return handled.Load() > 20 })
	f.proxy.freeze()
	close(release)
	took := within(t, 40*time.Second, "Bus.Stop", func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		_ = b.Stop(ctx)
	})
	t.Logf("Stop took %s", took)
	if limit := 2*5*time.Second + 3*time.Second; took > limit {
		t.Fatalf("Stop took %s while the database did not answer, want at most %s", took, limit)
	}
}
