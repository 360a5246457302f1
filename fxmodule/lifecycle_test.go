package fxmodule_test

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"go.uber.org/fx"
	"go.uber.org/zap"

	"github.com/millpond/millpond/bus"
	"github.com/millpond/millpond/fxmodule"
	"github.com/millpond/millpond/handlers"
	"github.com/millpond/millpond/internal/testdb"
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
