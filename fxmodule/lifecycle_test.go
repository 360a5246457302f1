package fxmodule_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"go.uber.org/fx"
	"go.uber.org/zap"

	"github.com/millpond/millpond/fxmodule"
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
