// Command pgwatermill is the smallest PostgreSQL-only Watermill program over
// the outbox: it publishes messages inside a pgx transaction, then consumes
// them with a Subscriber under a Watermill router, and exits. It imports
// only the PostgreSQL driver package, so it links neither SQLite nor the
// MySQL driver.
//
//	go run ./examples/pgwatermill -db 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable' -n 10
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/outbox/postgres"
)

func main() {
	db := flag.String("db", os.Getenv("DATABASE_URL"), "PostgreSQL address (env DATABASE_URL)")
	n := flag.Int("n", 10, "how many messages to publish and consume")
	flag.Parse()
	if err := run(*db, *n); err != nil {
		fmt.Fprintln(os.Stderr, "pgwatermill:", err)
		os.Exit(1)
	}
}

func run(address string, n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	store, err := postgres.Open(ctx, address)
	if err != nil {
		return err
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	sub, err := outbox.NewSubscriber(store, outbox.SubscriberConfig{ConsumerGroup: "pgwatermill"})
	if err != nil {
		return err
	}
	// Register the group before publishing: a group sees the events
	// enqueued after it registered.
	if err := sub.SubscribeInitialize("greetings"); err != nil {
		return err
	}

	// Publish inside the application's own pgx transaction.
	tx, err := store.Pool().Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	if err := publish(tx, store, n); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}

	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	var handled atomic.Int64
	router.AddConsumerHandler("greet", "greetings", sub, func(msg *message.Message) error {
		if handled.Add(1) == int64(n) {
			cancel()
		}
		return nil
	})
	if err := router.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	fmt.Printf("handled %d of %d messages\n", handled.Load(), n)
	if handled.Load() < int64(n) {
		return fmt.Errorf("only %d of %d messages arrived", handled.Load(), n)
	}
	return nil
}

func publish(tx pgx.Tx, store *outbox.Store, n int) error {
	pub, err := outbox.NewPublisher(store, outbox.PgxTx(tx))
	if err != nil {
		return err
	}
	for i := range n {
		msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"n":%d}`, i))
		msg.Metadata.Set(outbox.MetadataKind, "Greeted")
		if err := pub.Publish("greetings", msg); err != nil {
			return err
		}
	}
	return nil
}
