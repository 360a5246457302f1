package bus_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/millpond/millpond/bus"
	"github.com/millpond/millpond/handlers"
	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/outbox/sqlite"
)

// TestStartOnUnmigratedDatabaseSaysSo: a bus started before the outbox
// schema was installed (no Migrate, AutoMigrate forgotten) fails with
// outbox.ErrSchemaOutdated and ErrSchemaNotInstalled, as Subscribe does,
// not with the driver's "no such table" from registering its groups.
func TestStartOnUnmigratedDatabaseSaysSo(t *testing.T) {
	ctx := context.Background()
	store, err := sqlite.Open(ctx, "sqlite:"+filepath.Join(t.TempDir(), "fresh.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	h := handlers.New("ledger", "payments", "PaymentCaptured", func(context.Context, struct{}, handlers.Meta) error { return nil })
	b, err := bus.New(store, bus.Config{}, h)
	if err != nil {
		t.Fatal(err)
	}
	err = b.Start(ctx)
	if err == nil {
		_ = b.Stop(ctx)
		t.Fatal("the bus started on a database without the outbox schema")
	}
	if !errors.Is(err, outbox.ErrSchemaOutdated) || !errors.Is(err, outbox.ErrSchemaNotInstalled) {
		t.Fatalf("Start: %v; want an error wrapping outbox.ErrSchemaOutdated and ErrSchemaNotInstalled", err)
	}
	t.Logf("Start failed as intended: %v", err)
}
