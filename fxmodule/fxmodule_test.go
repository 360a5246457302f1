package fxmodule_test

import (
	"context"
	"path/filepath"
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
	"github.com/millpond/millpond/fxmodule"
	"github.com/millpond/millpond/handlers"
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
		msg.SetContext(outbox.ContextWithTx(ctx, tx))
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
