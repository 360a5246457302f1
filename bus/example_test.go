package bus_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/millpond/millpond/bus"
	"github.com/millpond/millpond/handlers"
	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/outbox/sqlite"
)

// OrderPlaced is the example's event, carried as JSON.
type OrderPlaced struct {
	OrderID int `json:"order_id"`
}

// A typed handler on the bus: handlers.New decodes each OrderPlaced
// payload; the handler's name is its consumer group, which Start registers
// before the application publishes. Returning nil acknowledges the event,
// an error retries it under the handler's policy.
func Example() {
	ctx := context.Background()
	store, cleanup := exampleStore()
	defer cleanup()

	reserved := make(chan int, 1)
	reserveStock := handlers.New("reserve-stock", "orders", "OrderPlaced",
		func(ctx context.Context, ev OrderPlaced, meta handlers.Meta) error {
			reserved <- ev.OrderID
			return nil
		},
		handlers.WithMaxAttempts(5),
	)
	b, err := bus.New(store, bus.Config{}, reserveStock)
	if err != nil {
		log.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer b.Stop(ctx)

	// The application records the event in its own transaction.
	var tx *sql.Tx
	tx, err = store.SQLDB().BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback() // a no-op once committed
	if _, err := store.Enqueue(ctx, outbox.SQLTx(tx), outbox.Event{Stream: "orders", Key: "order-42-placed", Kind: "OrderPlaced", Payload: []byte(`{"order_id":42}`)}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	select {
	case id := <-reserved:
		fmt.Println("reserved stock for order", id)
	case <-time.After(10 * time.Second):
		fmt.Println("timed out")
	}
	// Output: reserved stock for order 42
}

// exampleStore opens a migrated Store on a SQLite file in a new temporary
// directory; cleanup closes it and removes the directory.
func exampleStore() (*outbox.Store, func()) {
	dir, err := os.MkdirTemp("", "millpond-example")
	if err != nil {
		log.Fatal(err)
	}
	store, err := sqlite.Open(context.Background(), "sqlite:"+filepath.Join(dir, "app.db"))
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		log.Fatal(err)
	}
	return store, func() {
		store.Close()
		os.RemoveAll(dir)
	}
}
