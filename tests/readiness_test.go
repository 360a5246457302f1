package tests

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/millpond/millpond/bus"
	"github.com/millpond/millpond/handlers"
	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/outbox/anydb"
)

func readyz(t *testing.T, h http.Handler) (int, bus.Health, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	var report bus.Health
	if err := json.Unmarshal(rec.Body.Bytes(), &report); err != nil {
		t.Fatalf("body %q: %v", rec.Body.String(), err)
	}
	return rec.Code, report, rec.Body.String()
}

// The readiness handler answers 503 before Start, 200 while the bus runs
// (database reachable, listener connected on PostgreSQL, every subscriber
// running, the oldest pending age from the cached snapshot), 503 after
// Stop and when the database is gone, and never shows the address.
func TestReadiness(t *testing.T) {
	for _, dialect := range []string{"postgres", "sqlite"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, dialect)
			ctx := context.Background()
			url := db.URL
			if dialect == "postgres" {
				pw, _ := db.WithPassword(t, "pw-Readyz-91")
				url = pw
			}
			store, err := anydb.Open(ctx, url, outbox.WithStatsInterval(50*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			defer store.Close()
			if err := store.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			h := handlers.New("ready-h", "ready", "K", func(context.Context, telOrder, handlers.Meta) error { return nil })
			b, err := bus.New(store, bus.Config{Subscriber: outbox.SubscriberConfig{PollInterval: 20 * time.Millisecond}}, h)
			if err != nil {
				t.Fatal(err)
			}
			rh := b.ReadinessHandler(bus.HealthOptions{})
			if code, rep, _ := readyz(t, rh); code != http.StatusServiceUnavailable || rep.Ready || rep.Router != "starting" {
				t.Errorf("before start: %d %+v", code, rep)
			}
			// A pending event of the group, for the oldest age.
			if err := b.RegisterGroups(ctx); err != nil {
				t.Fatal(err)
			}
			tx, err := store.SQLDB().BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := store.Enqueue(ctx, outbox.SQLTx(tx), outbox.Event{Stream: "ready", Key: "k", Kind: "K", Payload: []byte(`{}`), Delay: time.Hour}); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond)
			if err := b.Start(ctx); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(10 * time.Second)
			for {
				code, rep, body := readyz(t, rh)
				if code == http.StatusOK && rep.OldestPendingAgeSeconds > 0 {
					if !rep.Ready || rep.Database != "ok" || rep.Subscribers != 2 || rep.SubscribersRunning != 2 || rep.StatsAt == nil || rep.OldestPendingAgeSeconds <= 0 {
						t.Errorf("ready: %s", body)
					}
					wantListener := map[string]string{"postgres": "connected", "sqlite": "off"}[dialect]
					if rep.Listener != wantListener {
						t.Errorf("listener %q, want %q", rep.Listener, wantListener)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("never ready: %d %s", code, body)
				}
				time.Sleep(20 * time.Millisecond)
			}
			if err := b.Stop(ctx); err != nil {
				t.Fatal(err)
			}
			if code, rep, _ := readyz(t, rh); code != http.StatusServiceUnavailable || rep.Router != "stopped" {
				t.Errorf("after stop: %d %+v", code, rep)
			}
			_ = store.Close()
			code, rep, body := readyz(t, rh)
			if code != http.StatusServiceUnavailable || rep.Database != "unreachable" {
				t.Errorf("database closed: %d %s", code, body)
			}
			for _, secret := range []string{"pw-Readyz-91", db.Name, "127.0.0.1"} {
				if strings.Contains(body, secret) {
					t.Errorf("the report shows %q: %s", secret, body)
				}
			}
		})
	}
}

// Store.Ping answers while the database does, and fails once it is closed.
func TestStorePing(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			db := testdb.New(t, dialect)
			store, err := anydb.Open(context.Background(), db.URL)
			if err != nil {
				t.Fatal(err)
			}
			if err := store.Ping(context.Background()); err != nil {
				t.Fatalf("ping: %v", err)
			}
			_ = store.Close()
			if err := store.Ping(context.Background()); err == nil {
				t.Error("ping after close: want an error")
			}
		})
	}
}

// A bus whose claims keep failing while the database still answers (here
// its delivery table was renamed away) is not ready once the failures
// have lasted ClaimFailureGrace, and ready again once claims succeed; with
// a negative grace the failing subscribers are only reported.
func TestReadinessWhenClaimsFail(t *testing.T) {
	for _, dialect := range []string{"postgres", "mysql", "sqlite"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, dialect)
			ctx := context.Background()
			store, err := anydb.Open(ctx, db.URL)
			if err != nil {
				t.Fatal(err)
			}
			defer store.Close()
			if err := store.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			h := handlers.New("failing-h", "failing", "K", func(context.Context, telOrder, handlers.Meta) error { return nil })
			b, err := bus.New(store, bus.Config{Subscriber: outbox.SubscriberConfig{PollInterval: 20 * time.Millisecond}}, h)
			if err != nil {
				t.Fatal(err)
			}
			if err := b.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer b.Stop(ctx)
			strict := b.ReadinessHandler(bus.HealthOptions{ClaimFailureGrace: 300 * time.Millisecond})
			lenient := b.ReadinessHandler(bus.HealthOptions{ClaimFailureGrace: -1})
			waitFor := func(what string, ok func(int, bus.Health) bool) bus.Health {
				t.Helper()
				deadline := time.Now().Add(15 * time.Second)
				for {
					code, rep, body := readyz(t, strict)
					if ok(code, rep) {
						return rep
					}
					if time.Now().After(deadline) {
						t.Fatalf("%s: never: %d %s", what, code, body)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
			waitFor("ready", func(code int, rep bus.Health) bool { return code == http.StatusOK && rep.SubscribersFailing == 0 })
			rename := func(from, to string) {
				t.Helper()
				if _, err := store.SQLDB().ExecContext(ctx, "ALTER TABLE "+from+" RENAME TO "+to); err != nil {
					t.Fatal(err)
				}
			}
			rename("millpond_deliveries", "millpond_deliveries_away")
			failedAt := time.Now()
			rep := waitFor("not ready", func(code int, rep bus.Health) bool { return code == http.StatusServiceUnavailable })
			if waited := time.Since(failedAt); waited < 300*time.Millisecond {
				t.Errorf("not ready after %v, before the grace of 300ms", waited)
			}
			if rep.SubscribersFailing < 1 || rep.Database != "ok" || rep.SubscribersRunning != 2 {
				t.Errorf("claims failing: %+v", rep)
			}
			// Each subscriber's streak began at its first failed claim.
			waitFor("both failing", func(code int, rep bus.Health) bool {
				return code == http.StatusServiceUnavailable && rep.SubscribersFailing == 2
			})
			if code, rep, body := readyz(t, lenient); code != http.StatusOK || rep.SubscribersFailing != 2 {
				t.Errorf("negative grace: %d %s", code, body)
			}
			rename("millpond_deliveries_away", "millpond_deliveries")
			waitFor("ready again", func(code int, rep bus.Health) bool { return code == http.StatusOK && rep.SubscribersFailing == 0 })
		})
	}
}

// A readiness probe must not wait for a Subscribe that waits for the
// database: Subscribe holds the subscriber's lock while it checks the
// schema and registers its group, and FailingSince (which bus.Health calls
// for every subscriber, without a context) must answer meanwhile.
func TestFailingSinceDoesNotWaitForSubscribe(t *testing.T) {
	db := testdb.New(t, "postgres")
	store := db.Store(t)
	ctx := context.Background()
	sub, err := outbox.NewSubscriber(store, outbox.SubscriberConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	lock, err := store.SQLDB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback()
	if _, err := lock.ExecContext(ctx, "LOCK TABLE millpond_subscriptions IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	subCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	subscribed := make(chan struct{})
	go func() {
		defer close(subscribed)
		_, _ = sub.Subscribe(subCtx, "waiting")
	}()
	time.Sleep(300 * time.Millisecond) // Subscribe waits for the lock
	answered := make(chan struct{})
	go func() {
		defer close(answered)
		sub.FailingSince()
	}()
	select {
	case <-answered:
	case <-time.After(3 * time.Second):
		t.Error("FailingSince waits for a Subscribe that waits for the database")
	}
	_ = lock.Rollback()
	cancel()
	<-subscribed
	<-answered
}
