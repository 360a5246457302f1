package outbox_test

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
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/outbox/postgres"
	"github.com/millpond/millpond/outbox/sqlite"
)

// Recording an event in the same transaction as the application's own
// write: both commit or neither does. Enqueuing the same key again with
// the same content is a no-op that returns the first event's id.
func ExampleStore_Enqueue() {
	ctx := context.Background()
	store, cleanup := exampleStore()
	defer cleanup()
	db := store.SQLDB()
	if _, err := db.ExecContext(ctx, "CREATE TABLE orders (id INTEGER PRIMARY KEY, total_cents INTEGER)"); err != nil {
		log.Fatal(err)
	}

	var tx *sql.Tx
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback() // a no-op once committed
	if _, err := tx.ExecContext(ctx, "INSERT INTO orders (id, total_cents) VALUES (?, ?)", 42, 1999); err != nil {
		log.Fatal(err)
	}
	ev := outbox.Event{Stream: "orders", Key: "order-42-placed", Kind: "OrderPlaced", Payload: []byte(`{"order_id":42}`)}
	first, err := store.Enqueue(ctx, outbox.SQLTx(tx), ev)
	if err != nil {
		log.Fatal(err)
	}
	again, err := store.Enqueue(ctx, outbox.SQLTx(tx), ev) // a retried request, say
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	fmt.Println("first inserted:", first.Inserted)
	fmt.Println("again inserted:", again.Inserted, "same id:", again.ID == first.ID)
	// Output:
	// first inserted: true
	// again inserted: false same id: true
}

// Publishing a Watermill message inside a pgx transaction, together with
// the application's own write. It needs a PostgreSQL server, so go test
// compiles it but does not run it (it has no Output comment); the
// conformance tests in the repository's tests folder publish in pgx
// transactions on a real server.
func ExampleNewPublisher_pgx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@127.0.0.1:5432/app?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := postgres.New(pool)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	var tx pgx.Tx
	tx, err = pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx) // a no-op once committed
	if _, err := tx.Exec(ctx, "UPDATE orders SET status = 'placed' WHERE id = $1", 42); err != nil {
		log.Fatal(err)
	}
	pub, err := outbox.NewPublisher(store, outbox.PgxTx(tx)) // one Publisher per transaction
	if err != nil {
		log.Fatal(err)
	}
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":42}`))
	msg.Metadata.Set(outbox.MetadataKind, "OrderPlaced")
	if err := pub.Publish("orders", msg); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
}

// A Subscriber under a Watermill router: the handler's consumer group is
// registered first (SubscribeInitialize), so it gets every event published
// from then on; returning nil acknowledges the message, an error retries it
// after a backoff and dead-letters it at the attempt limit.
func ExampleSubscriber() {
	ctx := context.Background()
	store, cleanup := exampleStore()
	defer cleanup()

	sub, err := outbox.NewSubscriber(store, outbox.SubscriberConfig{ConsumerGroup: "send-confirmation"})
	if err != nil {
		log.Fatal(err)
	}
	if err := sub.SubscribeInitialize("orders"); err != nil {
		log.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		log.Fatal(err)
	}
	handled := make(chan string, 1)
	router.AddConsumerHandler("send-confirmation", "orders", sub, func(msg *message.Message) error {
		handled <- msg.Metadata.Get(outbox.MetadataKind) + " " + string(msg.Payload)
		return nil
	})
	go func() {
		if err := router.Run(ctx); err != nil {
			log.Fatal(err)
		}
	}()
	<-router.Running()

	// Publish in the application's transaction.
	var tx *sql.Tx
	tx, err = store.SQLDB().BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	pub, err := outbox.NewPublisher(store, outbox.SQLTx(tx))
	if err != nil {
		log.Fatal(err)
	}
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":42}`))
	msg.Metadata.Set(outbox.MetadataKind, "OrderPlaced")
	if err := pub.Publish("orders", msg); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	select {
	case got := <-handled:
		fmt.Println(got)
	case <-time.After(10 * time.Second):
		fmt.Println("timed out")
	}
	if err := router.Close(); err != nil { // graceful: the ack is written
		log.Fatal(err)
	}
	// Output: OrderPlaced {"order_id":42}
}

// A Subscriber that holds its claims on PostgreSQL (HoldClaims): each batch
// stays locked in a transaction of its own while its messages are handled
// and is settled by one statement when the last is acked. For handlers that
// finish within seconds and do not acknowledge in their own transaction. It
// needs a PostgreSQL server, so go test compiles it but does not run it;
// tests/held_subscriber_test.go runs held subscribers on a real server.
func ExampleSubscriberConfig_holdClaims() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@127.0.0.1:5432/app?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := postgres.New(pool) // up to a quarter of the pool's connections hold batches
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	sub, err := outbox.NewSubscriber(store, outbox.SubscriberConfig{
		ConsumerGroup: "index-orders",
		BatchSize:     1000,
		MaxInFlight:   8,
		HoldClaims:    true,
		// Leased claims for the first minute after Subscribe (the default,
		// twice the 30 s lease): an event that crashes the process on
		// every restart still counts attempts and is dead-lettered.
		HoldClaimsAfter: time.Minute,
	})
	if err != nil {
		log.Fatal(err) // errors.ErrUnsupported on MySQL and SQLite
	}
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, "orders")
	if err != nil {
		log.Fatal(err)
	}
	for msg := range msgs {
		fmt.Println(msg.Metadata.Get(outbox.MetadataKind))
		msg.Ack() // written when the batch's last message is settled
	}
}

// exampleStore opens a migrated Store on a SQLite file in a new temporary
// directory, as sqlite.Open does in its example; cleanup closes it and removes the
// directory.
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
