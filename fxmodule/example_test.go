package fxmodule_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.uber.org/fx"
	"go.uber.org/zap"

	"github.com/millpond/millpond/fxmodule"
	"github.com/millpond/millpond/handlers"
	"github.com/millpond/millpond/outbox"
)

// OrderPlaced is the example's event, carried as JSON.
type OrderPlaced struct {
	OrderID int `json:"order_id"`
}

// Inventory stands for an application service a handler depends on.
type Inventory struct{ reserved chan int }

// NewInventory returns the example's inventory service.
func NewInventory() *Inventory { return &Inventory{reserved: make(chan int, 1)} }

// NewReserveStock is a handler constructor; fx injects its dependencies and
// fxmodule.AsHandler adds the handler to the bus.
func NewReserveStock(inv *Inventory) handlers.Handler {
	return handlers.New("reserve-stock", "orders", "OrderPlaced",
		func(ctx context.Context, ev OrderPlaced, meta handlers.Meta) error {
			inv.reserved <- ev.OrderID
			return nil
		})
}

// An fx application with millpond: fxmodule.Module provides the Store, a
// context Publisher and the Bus, migrates on start (AutoMigrate), starts
// the bus with every handler given through fxmodule.AsHandler, and stops
// it gracefully with the application. A real service would use
// zap.NewProduction, a postgres:// URL and app.Run().
func Example() {
	dir, err := os.MkdirTemp("", "millpond-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	var store *outbox.Store
	var pub *outbox.Publisher
	var inv *Inventory
	app := fx.New(
		fx.Provide(zap.NewNop),
		fx.Supply(fxmodule.Config{DatabaseURL: "sqlite:" + filepath.Join(dir, "app.db"), AutoMigrate: true}),
		fxmodule.Module,
		fxmodule.WithZapLogger(),
		fx.Provide(NewInventory, fxmodule.AsHandler(NewReserveStock)),
		fx.Populate(&store, &pub, &inv),
	)
	ctx := context.Background()
	if err := app.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer app.Stop(ctx)

	// A request handler publishes in its own transaction, carried by the
	// message's context.
	var tx *sql.Tx
	tx, err = store.SQLDB().BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback() // a no-op once committed
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":42}`))
	msg.Metadata.Set(outbox.MetadataKind, "OrderPlaced")
	msg.SetContext(outbox.ContextWithTx(ctx, outbox.SQLTx(tx)))
	if err := pub.Publish("orders", msg); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	select {
	case id := <-inv.reserved:
		fmt.Println("reserved stock for order", id)
	case <-time.After(10 * time.Second):
		fmt.Println("timed out")
	}
	// Output: reserved stock for order 42
}
