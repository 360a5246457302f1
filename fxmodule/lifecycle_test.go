package fxmodule_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/fx"
	"go.uber.org/zap"

	"github.com/millpond/millpond/bus"
	"github.com/millpond/millpond/fxmodule"
	"github.com/millpond/millpond/handlers"
	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// appURL returns the test database's address with an application_name of
// its own, so that the module's connections can be counted apart from the
// test's.
func appURL(t *testing.T, db *testdb.Database, app string) string {
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	return u.String()
}

func connections(t *testing.T, db *testdb.Database, app string) int {
	var n int
	if err := db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestFailedAutoMigrateClosesTheStore: when the store's OnStart hook fails
// (AutoMigrate refused by the database), fx runs no OnStop of that hook:
// the Store the constructor opened was never closed, its pool and
// PostgreSQL listener connected after app.Start returned the error.
func TestFailedAutoMigrateClosesTheStore(t *testing.T) {
	db := testdb.New(t, "postgres")
	app := db.Name + "_fx"
	// A table in the way makes the first migration fail.
	if _, err := db.Pool.Exec(context.Background(), "CREATE TABLE millpond_events (unrelated int)"); err != nil {
		t.Fatal(err)
	}
	a := fx.New(
		fx.Supply(zap.NewNop(), fxmodule.Config{DatabaseURL: appURL(t, db, app), AutoMigrate: true}),
		fxmodule.Module,
		fx.NopLogger,
	)
	if err := a.Err(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := a.Start(ctx)
	if err == nil {
		a.Stop(ctx)
		t.Fatal("start succeeded; the test needs a failing migration")
	}
	t.Logf("start failed as intended: %v", err)
	deadline := time.Now().Add(5 * time.Second)
	for connections(t, db, app) != 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := connections(t, db, app); n != 0 {
		t.Fatalf("%d connection(s) of the module's store still open 5 s after its start failed: the store was never closed", n)
	}
}

// TestFailedConstructionClosesTheStore: a Config.Bus or a set of handlers
// that bus.New refuses fails fx.New after the store has opened its pool
// and its PostgreSQL listener. fx runs no hook of an app that failed to
// build, so nothing else could ever close that store.
func TestFailedConstructionClosesTheStore(t *testing.T) {
	db := testdb.New(t, "postgres")
	db.Store(t) // migrated
	dup := func() handlers.Handler {
		return handlers.New("same-name", "orders", "OrderPlaced", func(context.Context, orderPlaced, handlers.Meta) error { return nil })
	}
	for i, c := range []struct {
		name string
		opts []fx.Option
	}{
		{"negative bus CloseTimeout", []fx.Option{fx.Supply(fxmodule.Config{Bus: bus.Config{CloseTimeout: -time.Second}})}},
		{"two handlers of one name", []fx.Option{fx.Supply(fxmodule.Config{}),
			fx.Provide(fxmodule.AsHandler(dup)), fx.Provide(fx.Annotate(dup, fx.ResultTags(`group:"`+fxmodule.HandlerGroup+`"`)))}},
	} {
		t.Run(c.name, func(t *testing.T) {
			app := fmt.Sprintf("%s_fx%d", db.Name, i)
			opts := append([]fx.Option{fx.Supply(zap.NewNop()), fxmodule.Module, fx.NopLogger,
				fx.Decorate(func(cfg fxmodule.Config) fxmodule.Config { cfg.DatabaseURL = appURL(t, db, app); return cfg })}, c.opts...)
			a := fx.New(opts...)
			if err := a.Err(); err == nil {
				t.Fatal("fx.New succeeded; the test needs a configuration the bus refuses")
			} else {
				t.Logf("fx.New failed as intended: %v", err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for connections(t, db, app) != 0 && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			if n := connections(t, db, app); n != 0 {
				t.Fatalf("%d connection(s) of the module's store still open 5 s after fx.New failed: the store was never closed", n)
			}
		})
	}
}

// TestFailedAppBuildLeavesNothingOpen: fx.New fails for a reason outside
// the module after the module's constructors ran: another constructor
// that takes the Store returns an error, or a dependency of the
// application is missing. fx runs no hook of an app that failed to build,
// so a store opened by its constructor would keep its pool, its
// PostgreSQL listener and their goroutines for good. The store opens in
// its OnStart hook instead: nothing is connected and no goroutine is left.
func TestFailedAppBuildLeavesNothingOpen(t *testing.T) {
	db := testdb.New(t, "postgres")
	db.Store(t) // migrated
	type missing interface{ Missing() }
	for i, c := range []struct {
		name string
		opts []fx.Option
	}{
		{"another constructor fails", []fx.Option{fx.Invoke(func(s *outbox.Store, b *bus.Bus) error {
			return errors.New("payments: no API key configured")
		})}},
		{"a dependency is missing", []fx.Option{fx.Invoke(func(*outbox.Store, *bus.Bus, missing) {})}},
	} {
		t.Run(c.name, func(t *testing.T) {
			app := fmt.Sprintf("%s_fxbuild%d", db.Name, i)
			runtime.GC()
			baseline := runtime.NumGoroutine()
			var built atomic.Bool
			opts := append([]fx.Option{fx.Supply(zap.NewNop(), fxmodule.Config{DatabaseURL: appURL(t, db, app), AutoMigrate: true}),
				fxmodule.Module, fx.NopLogger,
				// The module's own invoke runs first: the store and the bus
				// are built before the application's invokes fail.
				fx.Invoke(func(*outbox.Store) { built.Store(true) })}, c.opts...)
			newFailingAfter(t, opts, &built, "the store")
			deadline := time.Now().Add(5 * time.Second)
			for (connections(t, db, app) != 0 || runtime.NumGoroutine() > baseline) && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			if n := connections(t, db, app); n != 0 {
				t.Errorf("%d connection(s) of the module's store open 5 s after fx.New failed: the store can never be closed", n)
			}
			if n := runtime.NumGoroutine(); n > baseline {
				buf := make([]byte, 1<<16)
				t.Errorf("%d goroutine(s) before fx.New, %d 5 s after it failed:\n%s", baseline, n, buf[:runtime.Stack(buf, true)])
			}
		})
	}
}

// TestStoreWorksInAnInvoke: an fx.Invoke runs before any start hook, so
// the module's Store has not opened there; a Store method called in it
// (registering a group, as applications do at wiring time) opens the
// store and works, and the app then starts and stops as usual.
func TestStoreWorksInAnInvoke(t *testing.T) {
	url := "sqlite:" + filepath.Join(t.TempDir(), "invoke.db")
	var groups []outbox.GroupRegistration
	app := fx.New(fx.Supply(zap.NewNop(), fxmodule.Config{DatabaseURL: url}), fxmodule.Module, fx.NopLogger,
		fx.Invoke(func(s *outbox.Store) error {
			ctx := context.Background()
			if err := s.Migrate(ctx); err != nil {
				return err
			}
			return s.RegisterGroup(ctx, "orders", "billing", "OrderPlaced")
		}),
		fx.Invoke(func(lc fx.Lifecycle, s *outbox.Store) {
			lc.Append(fx.Hook{OnStart: func(ctx context.Context) (err error) {
				groups, err = s.RegisteredGroups(ctx, "orders")
				return err
			}})
		}))
	if err := app.Err(); err != nil {
		t.Fatalf("fx.New: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := app.Start(ctx); err != nil {
		t.Fatalf("start: %v", err)
	}
	if err := app.Stop(ctx); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if len(groups) != 1 || groups[0].Group != "billing" {
		t.Fatalf("registered groups %+v, want billing", groups)
	}
}

// newFailingAfter runs fx.New(opts...), which must fail after the
// constructor that sets built ran (named what), and fails the test
// otherwise.
func newFailingAfter(t *testing.T, opts []fx.Option, built *atomic.Bool, what string) {
	t.Helper()
	if err := fx.New(opts...).Err(); err == nil {
		t.Fatal("fx.New succeeded; the test needs it to fail")
	} else {
		t.Logf("fx.New failed as intended: %v", err)
	}
	if !built.Load() {
		t.Fatalf("%s was never built; the test needs fx.New to fail after it", what)
	}
}
