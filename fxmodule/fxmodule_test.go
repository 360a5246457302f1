package fxmodule_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/millpond/millpond/bus"
	"github.com/millpond/millpond/dsn"
	"github.com/millpond/millpond/fxmodule"
	"github.com/millpond/millpond/handlers"
	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

type orderPlaced struct {
	OrderID int `json:"order_id"`
}

// counters are the test's handler dependencies, provided through fx.
type counters struct{ reserve, notify atomic.Int64 }

func newReserve(c *counters) handlers.Handler {
	return handlers.New("reserve-stock", "orders", "OrderPlaced", func(ctx context.Context, ev orderPlaced, m handlers.Meta) error {
		c.reserve.Add(1)
		return nil
	})
}

func newNotify(c *counters) handlers.Handler {
	return handlers.New("notify", "orders", "OrderPlaced", func(ctx context.Context, ev orderPlaced, m handlers.Meta) error {
		c.notify.Add(1)
		return nil
	})
}

func TestModuleWiresStorePublisherBusAndZap(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	logger := zap.New(core)
	c := &counters{}
	var store *outbox.Store
	var pub *outbox.Publisher
	var b *bus.Bus
	app := fxtest.New(t,
		fx.Supply(logger, c),
		fx.Supply(fxmodule.Config{
			DatabaseURL: "sqlite:" + filepath.Join(t.TempDir(), "app.db"),
			AutoMigrate: true,
			Bus:         bus.Config{Subscriber: outbox.SubscriberConfig{PollInterval: 10 * time.Millisecond}},
		}),
		fxmodule.Module,
		fxmodule.WithZapLogger(),
		fx.Provide(fxmodule.AsHandler(newReserve), fxmodule.AsHandler(newNotify)),
		fx.Populate(&store, &pub, &b),
	)
	app.RequireStart()

	if got := len(b.Handlers()); got != 2 {
		t.Fatalf("bus has %d handlers, want the 2 of the value group", got)
	}
	// Publish in the application's transaction, through the context publisher.
	ctx := context.Background()
	tx, err := store.SQLDB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":1}`))
		msg.Metadata.Set(outbox.MetadataKind, "OrderPlaced")
		msg.SetContext(outbox.ContextWithTx(ctx, outbox.SQLTx(tx)))
		if err := pub.Publish("orders", msg); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	// A message without a transaction is refused, never committed alone.
	if err := pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte(`{}`))); err == nil {
		t.Fatal("publish without a transaction succeeded")
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for c.reserve.Load() < 5 || c.notify.Load() < 5 {
		if time.Now().After(deadline) {
			t.Fatalf("handled reserve=%d notify=%d of 5", c.reserve.Load(), c.notify.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	app.RequireStop()

	// fx, Watermill and the store all logged through the app's zap logger.
	if logs.FilterMessage("started").Len() == 0 {
		t.Error("no fx lifecycle event reached zap")
	}
	if logs.FilterMessageSnippet("Starting handler").Len() < 2 {
		t.Error("the Watermill router did not log its handlers through zap")
	}
	if logs.FilterLoggerName("millpond.bus").Len() == 0 {
		t.Error("no bus log carries the millpond.bus logger name")
	}
}

func TestModuleFailsClearlyOnABadDatabaseURL(t *testing.T) {
	app := fx.New(
		fx.Supply(zap.NewNop(), fxmodule.Config{DatabaseURL: "oracle://nowhere"}),
		fxmodule.Module,
		fx.NopLogger,
	)
	if err := app.Err(); err == nil {
		t.Fatal("an unknown database scheme was accepted")
	}
}

func TestModuleRefusesAnEmptyDatabaseURL(t *testing.T) {
	app := fx.New(
		fx.Supply(zap.NewNop(), fxmodule.Config{}),
		fxmodule.Module,
		fx.NopLogger,
	)
	if err := app.Err(); !errors.Is(err, fxmodule.ErrNoDatabaseURL) {
		t.Fatalf("an empty DatabaseURL: got %v, want ErrNoDatabaseURL", err)
	}
}

func TestModuleRefusesInvalidConfig(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name string
		cfg  fxmodule.Config
		want error
	}{
		{"negative OpenTimeout", fxmodule.Config{DatabaseURL: "sqlite:" + dir + "/a.db", OpenTimeout: -time.Second}, fxmodule.ErrInvalidConfig},
		{"unknown Unrouted policy", fxmodule.Config{DatabaseURL: "sqlite:" + dir + "/b.db", Bus: bus.Config{Unrouted: bus.UnroutedAcknowledge + 1}}, bus.ErrInvalidConfig},
		{"negative bus CloseTimeout", fxmodule.Config{DatabaseURL: "sqlite:" + dir + "/c.db", Bus: bus.Config{CloseTimeout: -time.Second}}, bus.ErrInvalidConfig},
	} {
		app := fx.New(fx.Supply(zap.NewNop(), c.cfg), fxmodule.Module, fx.NopLogger)
		if err := app.Err(); !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
}

// logged renders every entry the observer saw, fields included.
func logged(logs *observer.ObservedLogs) string {
	var b strings.Builder
	for _, e := range logs.All() {
		fmt.Fprintf(&b, "%s %s %v\n", e.LoggerName, e.Message, e.ContextMap())
	}
	return b.String()
}

// The store logs which database it opened, with the password hidden, and
// no start-up log or error of the module shows the password: neither when
// the database opens (PostgreSQL's trust authentication ignores it) nor
// when it cannot be reached.
func TestModuleLogsTheDatabaseWithoutItsPassword(t *testing.T) {
	const secret = "fx-Unique-Pw-4411"
	db := testdb.New(t, "postgres")
	_, kv := db.WithPassword(t, secret)
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}

	core, logs := observer.New(zap.DebugLevel)
	app := fxtest.New(t,
		fx.Supply(zap.New(core), fxmodule.Config{DatabaseURL: kv, AutoMigrate: true}),
		fxmodule.Module,
		fxmodule.WithZapLogger(),
	)
	app.RequireStart()
	app.RequireStop()
	opened := logs.FilterMessage("opened the outbox store").All()
	if len(opened) != 1 {
		t.Fatalf("%d 'opened the outbox store' lines, want 1:\n%s", len(opened), logged(logs))
	}
	fields := opened[0].ContextMap()
	if fields["dialect"] != "postgres" || !strings.Contains(fmt.Sprint(fields["database"]), "password=xxxxx") {
		t.Errorf("opened line: %v", fields)
	}
	if out := logged(logs); strings.Contains(out, secret) {
		t.Errorf("the logs show the password:\n%s", out)
	}

	for _, addr := range []string{
		strings.Replace(kv, "port="+u.Port(), "port=1", 1) + " connect_timeout=2",
		"postgres://admin:" + secret + "@127.0.0.1:1/db?connect_timeout=2",
		"postgress://admin:" + secret + "@127.0.0.1/db",
	} {
		core, logs := observer.New(zap.DebugLevel)
		app := fx.New(
			fx.Supply(zap.New(core), fxmodule.Config{DatabaseURL: addr}),
			fxmodule.Module,
			fxmodule.WithZapLogger(),
		)
		// An address refused by its form fails fx.New; one that does not
		// answer fails the start, where the store opens.
		err := app.Err()
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err = app.Start(ctx)
			cancel()
		}
		if err == nil {
			t.Fatalf("%s: opened", dsn.Redact(addr))
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("the error shows the password: %v", err)
		}
		if out := logged(logs); strings.Contains(out, secret) {
			t.Errorf("the logs show the password:\n%s", out)
		}
	}
}
