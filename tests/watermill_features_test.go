package tests

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/cqrs"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

func receive(t *testing.T, msgs <-chan *message.Message, within time.Duration) *message.Message {
	t.Helper()
	select {
	case msg, ok := <-msgs:
		if !ok {
			t.Fatal("channel closed")
		}
		return msg
	case <-time.After(within):
		t.Fatalf("no message within %s", within)
		return nil
	}
}

func expectNothing(t *testing.T, msgs <-chan *message.Message, within time.Duration) {
	t.Helper()
	select {
	case msg := <-msgs:
		t.Fatalf("unexpected message %s", msg.UUID)
	case <-time.After(within):
	}
}

func subscribe(t *testing.T, store *outbox.Store, cfg outbox.SubscriberConfig, topic string) (*outbox.Subscriber, <-chan *message.Message) {
	t.Helper()
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 10 * time.Millisecond
	}
	sub, err := outbox.NewSubscriber(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	msgs, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	return sub, msgs
}

func TestWatermillPublisherAndSubscriber(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Run("PublishInsideTheCallersTransaction", func(t *testing.T) { testPublishInTx(t, dialect) })
			t.Run("CQRSRunsUnchanged", func(t *testing.T) { testCQRS(t, dialect) })
			t.Run("LeaseIsExtendedWhileUnacked", func(t *testing.T) { testLeaseExtension(t, dialect) })
			t.Run("NackRetriesThenDeadLettersWithSanitisedError", func(t *testing.T) { testNack(t, dialect) })
			t.Run("CloseReleasesWhatWasNotHandedOut", func(t *testing.T) { testCloseReleases(t, dialect) })
		})
	}
}

func testPublishInTx(t *testing.T, dialect string) {
	t.Parallel()
	db := testdb.New(t, dialect)
	store := db.Store(t)
	_, msgs := subscribe(t, store, outbox.SubscriberConfig{}, "orders")

	// Rolled back: never delivered.
	tx, _, rollback := db.Begin(t)
	pub, err := outbox.NewPublisher(store, tx)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("orders", message.NewMessage("rolled-back", []byte("x"))); err != nil {
		t.Fatal(err)
	}
	rollback()

	// Committed: delivered with its metadata, kind and key.
	tx, commit, _ := db.Begin(t)
	pub, err = outbox.NewPublisher(store, tx)
	if err != nil {
		t.Fatal(err)
	}
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"id":1}`))
	msg.Metadata.Set(outbox.MetadataKind, "OrderPlaced")
	msg.Metadata.Set("traceparent", "00-abc-def-01")
	if err := pub.Publish("orders", msg); err != nil {
		t.Fatal(err)
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}
	got := receive(t, msgs, 10*time.Second)
	got.Ack()
	if got.UUID != msg.UUID || string(got.Payload) != `{"id":1}` || got.Metadata.Get("traceparent") != "00-abc-def-01" ||
		got.Metadata.Get(outbox.MetadataKind) != "OrderPlaced" || got.Metadata.Get(outbox.MetadataAttempt) != "1" {
		t.Fatalf("delivered %s %q %v", got.UUID, got.Payload, got.Metadata)
	}
	expectNothing(t, msgs, 300*time.Millisecond)

	// No transaction: refused, never committed on its own.
	ctxPub, err := outbox.NewContextPublisher(store)
	if err != nil {
		t.Fatal(err)
	}
	if err := ctxPub.Publish("orders", message.NewMessage(watermill.NewUUID(), nil)); !errors.Is(err, outbox.ErrNoTransaction) {
		t.Fatalf("context publisher without a tx: %v, want ErrNoTransaction", err)
	}
	// Pools and connections cannot become an outbox.Tx (the compiler
	// refuses them; tests/typedtx_test.go proves it); the zero Tx is refused.
	if _, err := outbox.NewPublisher(store, outbox.Tx{}); !errors.Is(err, outbox.ErrNoTransaction) {
		t.Fatalf("publisher over no transaction: %v, want ErrNoTransaction", err)
	}
}

type cqrsOrderPlaced struct {
	OrderID string `json:"order_id"`
}

func testCQRS(t *testing.T, dialect string) {
	t.Parallel()
	db := testdb.New(t, dialect)
	store := db.Store(t)
	logger := watermill.NopLogger{}
	marshaler := cqrs.JSONMarshaler{GenerateName: cqrs.StructName}
	publisher, err := outbox.NewContextPublisher(store)
	if err != nil {
		t.Fatal(err)
	}
	eventBus, err := cqrs.NewEventBusWithConfig(publisher, cqrs.EventBusConfig{
		GeneratePublishTopic: func(cqrs.GenerateEventPublishTopicParams) (string, error) { return "cqrs-events", nil },
		Marshaler:            marshaler,
		Logger:               logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		t.Fatal(err)
	}
	processor, err := cqrs.NewEventProcessorWithConfig(router, cqrs.EventProcessorConfig{
		GenerateSubscribeTopic: func(cqrs.EventProcessorGenerateSubscribeTopicParams) (string, error) { return "cqrs-events", nil },
		SubscriberConstructor: func(p cqrs.EventProcessorSubscriberConstructorParams) (message.Subscriber, error) {
			return outbox.NewSubscriber(store, outbox.SubscriberConfig{ConsumerGroup: p.HandlerName, PollInterval: 10 * time.Millisecond})
		},
		Marshaler: marshaler,
		Logger:    logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 10)
	if err := processor.AddHandlers(cqrs.NewEventHandler("on-order-placed", func(ctx context.Context, ev *cqrsOrderPlaced) error {
		got <- ev.OrderID
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	go func() { _ = router.Run(context.Background()) }()
	t.Cleanup(func() { _ = router.Close() })
	<-router.Running()

	tx, commit, _ := db.Begin(t)
	if err := eventBus.Publish(outbox.ContextWithTx(context.Background(), tx), &cqrsOrderPlaced{OrderID: "o-1"}); err != nil {
		t.Fatal(err)
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-got:
		if id != "o-1" {
			t.Fatalf("handled %q", id)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the CQRS event handler was not called")
	}
	if n := db.Count(t, "SELECT COUNT(*) FROM millpond_outbox WHERE event_kind = 'cqrsOrderPlaced'"); n != 1 {
		t.Fatalf("event kind from the CQRS name: %d rows of kind cqrsOrderPlaced, want 1", n)
	}
}

func testLeaseExtension(t *testing.T, dialect string) {
	t.Parallel()
	db := testdb.New(t, dialect)
	store := db.Store(t)
	cfg := outbox.SubscriberConfig{ConsumerGroup: "g", Lease: time.Second}
	_, first := subscribe(t, store, cfg, "leases")
	_, second := subscribe(t, store, cfg, "leases")
	pub, _ := outbox.NewAutoCommitPublisher(store)
	if err := pub.Publish("leases", message.NewMessage(watermill.NewUUID(), []byte("slow"))); err != nil {
		t.Fatal(err)
	}
	var msg *message.Message
	select {
	case msg = <-first:
	case msg = <-second:
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery")
	}
	// Held three leases long: the lease is extended, nobody else gets it.
	deadline := time.After(3500 * time.Millisecond)
	for waiting := true; waiting; {
		select {
		case m := <-first:
			t.Fatalf("redelivered %s while its handler still ran", m.UUID)
		case m := <-second:
			t.Fatalf("redelivered %s while its handler still ran", m.UUID)
		case <-deadline:
			waiting = false
		}
	}
	msg.Ack()
	waitForCount(t, db, "SELECT COUNT(*) FROM millpond_outbox WHERE status = 'delivered' AND attempts = 1", 1)
}

func waitForCount(t *testing.T, db *testdb.Database, query string, want int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := db.Count(t, query)
		if n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s = %d, want %d", query, n, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func testNack(t *testing.T, dialect string) {
	t.Parallel()
	db := testdb.New(t, dialect)
	store := db.Store(t)
	_, msgs := subscribe(t, store, outbox.SubscriberConfig{MaxAttempts: 2, Backoff: func(int) time.Duration { return 0 }}, "nacks")
	pub, _ := outbox.NewAutoCommitPublisher(store)
	if err := pub.Publish("nacks", message.NewMessage(watermill.NewUUID(), []byte("x"))); err != nil {
		t.Fatal(err)
	}
	long := "bad\x00input\n" + strings.Repeat("é", 600)
	for attempt := 1; attempt <= 2; attempt++ {
		msg := receive(t, msgs, 10*time.Second)
		if got := msg.Metadata.Get(outbox.MetadataAttempt); got != string(rune('0'+attempt)) {
			t.Fatalf("attempt metadata %q, want %d", got, attempt)
		}
		msg.Metadata.Set(outbox.MetadataHandlerError, long)
		msg.Nack()
	}
	expectNothing(t, msgs, 300*time.Millisecond)
	var dead []outbox.DeadEvent
	deadline := time.Now().Add(10 * time.Second)
	for len(dead) == 0 && time.Now().Before(deadline) {
		dead, _ = store.ListDead(context.Background(), outbox.DeadQuery{Stream: "nacks", Limit: 10})
		time.Sleep(20 * time.Millisecond)
	}
	if len(dead) != 1 || dead[0].Attempts != 2 {
		t.Fatalf("dead letters %v", dead)
	}
	if e := dead[0].LastError; len(e) > outbox.MaxErrorBytes || !strings.HasPrefix(e, "bad input") || strings.ContainsAny(e, "\x00\n") {
		t.Fatalf("stored error not sanitised: %d bytes %q", len(e), e[:min(len(e), 40)])
	}
}

func testCloseReleases(t *testing.T, dialect string) {
	t.Parallel()
	db := testdb.New(t, dialect)
	store := db.Store(t)
	sub, msgs := subscribe(t, store, outbox.SubscriberConfig{BatchSize: 10, CloseTimeout: 10 * time.Second}, "close")
	pub, _ := outbox.NewAutoCommitPublisher(store)
	var batch []*message.Message
	for range 10 {
		batch = append(batch, message.NewMessage(watermill.NewUUID(), []byte("x")))
	}
	if err := pub.Publish("close", batch...); err != nil {
		t.Fatal(err)
	}
	receive(t, msgs, 10*time.Second).Ack()
	running := receive(t, msgs, 10*time.Second) // its handler is still running when Close starts
	// Wait until the other eight are claimed and waiting in the subscriber.
	waitForCount(t, db, "SELECT COUNT(*) FROM millpond_outbox WHERE status = 'processing'", 9)
	closed := make(chan error, 1)
	go func() { closed <- sub.Close() }()
	// The eight that no handler started are handed back at once, while the
	// running one may still finish.
	waitForCount(t, db, "SELECT COUNT(*) FROM millpond_outbox WHERE status = 'pending' AND attempts = 0", 8)
	select {
	case <-closed:
		t.Fatal("Close returned before the running message was settled")
	default:
	}
	running.Ack()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return after the last message was acked")
	}
	if _, open := <-msgs; open {
		t.Fatal("channel still open after Close")
	}
	if n := db.Count(t, "SELECT COUNT(*) FROM millpond_outbox WHERE status = 'delivered'"); n != 2 {
		t.Fatalf("%d delivered, want the 2 acked (one during Close)", n)
	}
}

// TestAcknowledgeInTheHandlersTransaction shows exactly-once effects for a
// handler that writes to the same database: its write and the
// acknowledgement commit together, and a rolled-back attempt leaves
// neither.
func TestAcknowledgeInTheHandlersTransaction(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, dialect)
			store := db.Store(t)
			db.Exec(t, "CREATE TABLE effects (event_key VARCHAR(64) NOT NULL, attempt INT NOT NULL)")
			_, msgs := subscribe(t, store, outbox.SubscriberConfig{Backoff: func(int) time.Duration { return 0 }}, "effects")
			pub, _ := outbox.NewAutoCommitPublisher(store)
			key := watermill.NewUUID()
			if err := pub.Publish("effects", message.NewMessage(key, []byte("x"))); err != nil {
				t.Fatal(err)
			}
			insert := "INSERT INTO effects (event_key, attempt) VALUES (?, ?)"
			if dialect == "postgres" {
				insert = "INSERT INTO effects (event_key, attempt) VALUES ($1, $2)"
			}
			handle := func(commit bool) {
				msg := receive(t, msgs, 10*time.Second)
				raw, commitTx, rollback := db.BeginRaw(t)
				var err error
				switch tx := raw.(type) {
				case interface {
					ExecContext(context.Context, string, ...any) (sql.Result, error)
				}:
					_, err = tx.ExecContext(context.Background(), insert, msg.UUID, msg.Metadata.Get(outbox.MetadataAttempt))
				case pgx.Tx:
					_, err = tx.Exec(context.Background(), insert, msg.UUID, msg.Metadata.Get(outbox.MetadataAttempt))
				}
				if err != nil {
					t.Fatal(err)
				}
				if err := store.AcknowledgeMessageInTx(context.Background(), testdb.Wrap(raw), msg); err != nil {
					t.Fatal(err)
				}
				if commit {
					if err := commitTx(); err != nil {
						t.Fatal(err)
					}
					msg.Ack()
					return
				}
				rollback() // the handler failed after its write
				msg.Nack()
			}
			handle(false)
			if n := db.Count(t, "SELECT COUNT(*) FROM effects"); n != 0 {
				t.Fatalf("a rolled-back attempt left %d effects", n)
			}
			handle(true)
			expectNothing(t, msgs, 500*time.Millisecond)
			if n := db.Count(t, "SELECT COUNT(*) FROM effects WHERE attempt = 2"); n != 1 {
				t.Fatalf("effects of attempt 2: %d, want 1", n)
			}
			if n := db.Count(t, "SELECT COUNT(*) FROM millpond_outbox WHERE status = 'delivered' AND attempts = 2"); n != 1 {
				t.Fatalf("the event is not delivered with the handler's commit")
			}
			// A message that did not come from a Subscriber has no receipt.
			tx, _, rollback := db.Begin(t)
			defer rollback()
			if err := store.AcknowledgeMessageInTx(context.Background(), tx, message.NewMessage("x", nil)); err == nil {
				t.Fatal("acknowledged a message without a receipt")
			}
		})
	}
}

// TestNackAfterAnInTxAckThatOutlivedItsLease: once a handler acknowledged
// in its own transaction, the Subscriber stops extending the lease (an
// extension would wait for the row the acknowledgement locked). A
// transaction that then outlives the lease and rolls back leaves the event
// due again at once; the Nack that follows is not recorded, and the log
// says so instead of claiming that the acknowledgement stands. Nothing is
// lost: the event comes back.
func TestNackAfterAnInTxAckThatOutlivedItsLease(t *testing.T) {
	db := testdb.New(t, "sqlite")
	store := db.Store(t)
	var logs logLines
	_, msgs := subscribe(t, store, outbox.SubscriberConfig{Lease: outbox.MinLease, Backoff: func(int) time.Duration { return time.Hour },
		Logger: logs.watermill()}, "slow")
	pub, _ := outbox.NewAutoCommitPublisher(store)
	if err := pub.Publish("slow", message.NewMessage(watermill.NewUUID(), []byte("x"))); err != nil {
		t.Fatal(err)
	}
	msg := receive(t, msgs, 10*time.Second)
	tx, _, rollback := db.Begin(t)
	if err := store.AcknowledgeMessageInTx(context.Background(), tx, msg); err != nil {
		t.Fatal(err)
	}
	time.Sleep(outbox.MinLease + 500*time.Millisecond) // the transaction outlives the lease
	rollback()
	msg.Nack()
	again := receive(t, msgs, 10*time.Second)
	if again.UUID != msg.UUID || again.Metadata.Get(outbox.MetadataAttempt) != "2" {
		t.Fatalf("got %s attempt %s, want the event again at attempt 2", again.UUID, again.Metadata.Get(outbox.MetadataAttempt))
	}
	again.Ack()
	if got := logs.matching("not recorded"); len(got) != 1 || len(logs.matching("acknowledgement stands")) != 0 {
		t.Errorf("log lines about the Nack: %q, want one saying it was not recorded", got)
	}
}
