package outbox_test

// What a team that runs Watermill handlers does on its first day with the
// outbox's Publisher and Subscriber: a message.Router with Watermill's own
// middleware, handlers that fail, panic or run long, a poison queue, a
// router closed while handlers run. Each test asserts what Watermill's
// documentation promises or what the outbox's documentation says instead.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/internal/testlog"
	"github.com/millpond/millpond/outbox"
)

// adoptionDialects are the databases these tests run on: the embedded
// default and the one with LISTEN/NOTIFY.
var adoptionDialects = []string{"sqlite", "postgres"}

func forAdoptionDialects(t *testing.T, test func(t *testing.T, db *testdb.Database, store *outbox.Store)) {
	for _, dialect := range adoptionDialects {
		t.Run(dialect, func(t *testing.T) {
			db := testdb.New(t, dialect)
			test(t, db, db.Store(t))
		})
	}
}

// runRouter runs r until the test ends and returns once it is running.
func runRouter(t *testing.T, r *message.Router) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	select {
	case <-r.Running():
	case err := <-done:
		t.Fatalf("router did not start: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("router did not start within 10s")
	}
	t.Cleanup(func() {
		_ = r.Close()
		<-done
	})
}

func newRouter(t *testing.T, logger watermill.LoggerAdapter) *message.Router {
	t.Helper()
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func newSubscriber(t *testing.T, store *outbox.Store, cfg outbox.SubscriberConfig) *outbox.Subscriber {
	t.Helper()
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 10 * time.Millisecond
	}
	sub, err := outbox.NewSubscriber(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

func publishAutoCommit(t *testing.T, store *outbox.Store, topic string, msgs ...*message.Message) {
	t.Helper()
	pub, err := outbox.NewAutoCommitPublisher(store)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(topic, msgs...); err != nil {
		t.Fatal(err)
	}
}

// deadLetter waits for the event of key uuid in stream "orders" to be
// dead-lettered and returns its record.
func deadLetter(t *testing.T, store *outbox.Store, uuid string) outbox.EventRecord {
	t.Helper()
	waitFor(t, "the event to be dead-lettered", func() bool {
		return findOne(t, store, "orders", uuid).Status == outbox.StatusDead
	})
	return findOne(t, store, "orders", uuid)
}

func findOne(t *testing.T, store *outbox.Store, stream, key string) outbox.EventRecord {
	t.Helper()
	rows, err := store.FindEvents(context.Background(), outbox.EventQuery{Stream: stream, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 {
		t.Fatalf("%d rows for the event, want 1", len(rows))
	}
	return rows[0]
}

// waitFor polls cond until it holds or 10 s have passed.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// A message published inside the caller's transaction reaches a router
// handler with its UUID and metadata; the handler's produced message,
// published by the router through an auto-commit Publisher, carries the
// correlation id on, and the handler sees the router's context values.
func TestAdoptionRouterRoundTrip(t *testing.T) {
	forAdoptionDialects(t, func(t *testing.T, db *testdb.Database, store *outbox.Store) {
		sub := newSubscriber(t, store, outbox.SubscriberConfig{ConsumerGroup: "billing"})
		out, err := outbox.NewAutoCommitPublisher(store)
		if err != nil {
			t.Fatal(err)
		}
		r := newRouter(t, nil)
		r.AddMiddleware(middleware.CorrelationID, middleware.Recoverer)
		seen := make(chan *message.Message, 1)
		handlerNames := make(chan string, 1)
		r.AddHandler("invoice", "orders", sub, "invoices", out, func(msg *message.Message) ([]*message.Message, error) {
			handlerNames <- message.HandlerNameFromCtx(msg.Context())
			return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte("invoice for "+string(msg.Payload)))}, nil
		})
		r.AddConsumerHandler("audit", "invoices", sub, func(msg *message.Message) error {
			seen <- msg
			return nil
		})
		runRouter(t, r)

		orderUUID := watermill.NewUUID()
		msg := message.NewMessage(orderUUID, []byte("order-1"))
		msg.Metadata.Set("tenant", "acme")
		middleware.SetCorrelationID("corr-42", msg)
		tx, commit, _ := db.Begin(t)
		pub, err := outbox.NewPublisher(store, tx)
		if err != nil {
			t.Fatal(err)
		}
		if err := pub.Publish("orders", msg); err != nil {
			t.Fatal(err)
		}
		if err := commit(); err != nil {
			t.Fatal(err)
		}

		select {
		case name := <-handlerNames:
			if name != "invoice" {
				t.Errorf("handler name in the message context = %q, want invoice", name)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the order was not handled")
		}
		var got *message.Message
		select {
		case got = <-seen:
		case <-time.After(10 * time.Second):
			t.Fatal("the produced invoice was not delivered")
		}
		if string(got.Payload) != "invoice for order-1" {
			t.Errorf("payload %q", got.Payload)
		}
		if c := middleware.MessageCorrelationID(got); c != "corr-42" {
			t.Errorf("correlation id %q, want corr-42", c)
		}
		if a := got.Metadata.Get(outbox.MetadataAttempt); a != "1" {
			t.Errorf("attempt %q, want 1", a)
		}
		// The order itself: delivered once, its UUID its key, its metadata kept.
		rec := findOne(t, store, "orders", orderUUID)
		waitFor(t, "the order to be acknowledged", func() bool {
			return findOne(t, store, "orders", orderUUID).Status == outbox.StatusDelivered
		})
		if rec.Metadata["tenant"] != "acme" || rec.Metadata[middleware.CorrelationIDMetadataKey] != "corr-42" {
			t.Errorf("stored metadata %v lost the tenant or correlation id", rec.Metadata)
		}
	})
}

// A handler's error and a recovered panic are Nacks: the event is retried
// after the Subscriber's Backoff with the next attempt number, the error
// text kept as the last error (RecordHandlerError outside Recoverer), and
// dead-lettered at MaxAttempts, where Watermill's own Pub/Subs redeliver
// forever.
func TestAdoptionNackIsRetriedThenDeadLettered(t *testing.T) {
	forAdoptionDialects(t, func(t *testing.T, db *testdb.Database, store *outbox.Store) {
		sub := newSubscriber(t, store, outbox.SubscriberConfig{
			ConsumerGroup: "billing", MaxAttempts: 3,
			Backoff: func(int) time.Duration { return 50 * time.Millisecond },
		})
		r := newRouter(t, nil)
		r.AddMiddleware(outbox.RecordHandlerError, middleware.Recoverer)
		var mu sync.Mutex
		var attempts []string
		r.AddConsumerHandler("charge", "orders", sub, func(msg *message.Message) error {
			mu.Lock()
			attempts = append(attempts, msg.Metadata.Get(outbox.MetadataAttempt))
			n := len(attempts)
			mu.Unlock()
			if n == 2 {
				panic("card processor exploded")
			}
			return fmt.Errorf("card declined (try %d)", n)
		})
		runRouter(t, r)
		uuid := watermill.NewUUID()
		publishAutoCommit(t, store, "orders", message.NewMessage(uuid, []byte("{}")))

		rec := deadLetter(t, store, uuid)
		mu.Lock()
		defer mu.Unlock()
		if got := strings.Join(attempts, ","); got != "1,2,3" {
			t.Errorf("attempts seen %q, want 1,2,3 (one delivery per Nack, then dead)", got)
		}
		if rec.Attempts != 3 || !strings.Contains(rec.LastError, "card declined (try 3)") {
			t.Errorf("dead letter: %d attempts, last error %q", rec.Attempts, rec.LastError)
		}
	})
}

// A panic's text is what RecordHandlerError keeps, when it runs outside
// Recoverer.
func TestAdoptionRecoveredPanicIsTheLastError(t *testing.T) {
	db := testdb.New(t, "sqlite")
	store := db.Store(t)
	sub := newSubscriber(t, store, outbox.SubscriberConfig{ConsumerGroup: "billing", MaxAttempts: 1})
	r := newRouter(t, nil)
	r.AddMiddleware(outbox.RecordHandlerError, middleware.Recoverer)
	r.AddConsumerHandler("charge", "orders", sub, func(msg *message.Message) error {
		panic("card processor exploded")
	})
	runRouter(t, r)
	uuid := watermill.NewUUID()
	publishAutoCommit(t, store, "orders", message.NewMessage(uuid, []byte("{}")))
	if e := deadLetter(t, store, uuid).LastError; !strings.Contains(e, "card processor exploded") {
		t.Errorf("last error %q does not name the panic", e)
	}
}

// middleware.Retry runs the handler again within one delivery: the outbox
// counts one attempt for all of them, and the lease is extended while
// Retry waits, so a second subscriber of the group never gets the event,
// even when the retries outlast the lease several times.
func TestAdoptionRetryMiddlewareIsOneDelivery(t *testing.T) {
	forAdoptionDialects(t, func(t *testing.T, db *testdb.Database, store *outbox.Store) {
		cfg := outbox.SubscriberConfig{ConsumerGroup: "billing", Lease: time.Second}
		first, second := newSubscriber(t, store, cfg), newSubscriber(t, store, cfg)
		r := newRouter(t, nil)
		r.AddMiddleware(middleware.Retry{MaxRetries: 4, InitialInterval: 700 * time.Millisecond, Multiplier: 1}.Middleware)
		var calls atomic.Int32
		var mu sync.Mutex
		var attempts []string
		handler := func(msg *message.Message) error {
			mu.Lock()
			attempts = append(attempts, msg.Metadata.Get(outbox.MetadataAttempt))
			mu.Unlock()
			if calls.Add(1) < 5 {
				return errors.New("not yet")
			}
			return nil
		}
		r.AddConsumerHandler("charge-1", "orders", first, handler)
		r.AddConsumerHandler("charge-2", "orders", second, handler)
		runRouter(t, r)
		uuid := watermill.NewUUID()
		publishAutoCommit(t, store, "orders", message.NewMessage(uuid, []byte("{}")))

		waitFor(t, "the event to be acknowledged", func() bool {
			return findOne(t, store, "orders", uuid).Status == outbox.StatusDelivered
		})
		time.Sleep(1500 * time.Millisecond) // a lease's worth: a lost lease would show now
		rec := findOne(t, store, "orders", uuid)
		mu.Lock()
		defer mu.Unlock()
		if got := strings.Join(attempts, ","); got != "1,1,1,1,1" {
			t.Errorf("attempts seen %q, want five calls of attempt 1 (2.8 s of retries, lease 1 s)", got)
		}
		if rec.Attempts != 1 || rec.Status != outbox.StatusDelivered {
			t.Errorf("event %s after %d attempts, want delivered after 1", rec.Status, rec.Attempts)
		}
	})
}

// middleware.PoisonQueue publishing through an auto-commit Publisher: the
// failed message goes to the poison stream with Watermill's reason
// metadata and its UUID (the key: a second poisoning of a redelivered
// event is an idempotent no-op), and the original is acknowledged.
func TestAdoptionPoisonQueue(t *testing.T) {
	forAdoptionDialects(t, func(t *testing.T, db *testdb.Database, store *outbox.Store) {
		sub := newSubscriber(t, store, outbox.SubscriberConfig{ConsumerGroup: "billing"})
		poisonSub := newSubscriber(t, store, outbox.SubscriberConfig{ConsumerGroup: "ops"})
		// Registered before the first poisoned message, so the ops group
		// sees it (a group sees only events enqueued after it registered).
		if err := poisonSub.SubscribeInitialize("orders_poison"); err != nil {
			t.Fatal(err)
		}
		poisonPub, err := outbox.NewAutoCommitPublisher(store)
		if err != nil {
			t.Fatal(err)
		}
		pq, err := middleware.PoisonQueue(poisonPub, "orders_poison")
		if err != nil {
			t.Fatal(err)
		}
		r := newRouter(t, nil)
		// Timeout outside PoisonQueue: Timeout cancels the message's
		// context when the handler inside it returns, and the Publisher
		// enqueues with that context.
		r.AddMiddleware(middleware.Timeout(5*time.Second), outbox.RecordHandlerError, pq)
		r.AddConsumerHandler("charge", "orders", sub, func(msg *message.Message) error {
			return errors.New("unprocessable order")
		})
		poisoned := make(chan *message.Message, 1)
		r.AddConsumerHandler("ops", "orders_poison", poisonSub, func(msg *message.Message) error {
			poisoned <- msg
			return nil
		})
		runRouter(t, r)
		uuid := watermill.NewUUID()
		msg := message.NewMessage(uuid, []byte(`{"id":1}`))
		msg.Metadata.Set(outbox.MetadataKind, "OrderPlaced")
		msg.Metadata.Set(outbox.MetadataOrderingKey, "order-1")
		publishAutoCommit(t, store, "orders", msg)

		var got *message.Message
		select {
		case got = <-poisoned:
		case <-time.After(10 * time.Second):
			t.Fatalf("nothing reached the poison queue: %+v", findOne(t, store, "orders", uuid).LastError)
		}
		if got.UUID != uuid || got.Metadata.Get(middleware.ReasonForPoisonedKey) != "unprocessable order" ||
			got.Metadata.Get(middleware.PoisonedTopicKey) != "orders" || got.Metadata.Get(outbox.MetadataKind) != "OrderPlaced" {
			t.Errorf("poisoned message %s %v", got.UUID, got.Metadata)
		}
		// The delivered message's metadata goes with it, its ordering key
		// too: the poison stream keeps the key's order.
		if k := findOne(t, store, "orders_poison", uuid).Metadata[outbox.MetadataOrderingKey]; k != "order-1" {
			t.Errorf("poisoned event's ordering key %q, want order-1", k)
		}
		waitFor(t, "the original to be acknowledged", func() bool {
			return findOne(t, store, "orders", uuid).Status == outbox.StatusDelivered
		})
		// The same event poisoned again (redelivered after a lost ack):
		// the same key, kind and payload, so nothing new is enqueued.
		again := message.NewMessage(uuid, []byte(`{"id":1}`))
		again.Metadata.Set(outbox.MetadataKind, "OrderPlaced")
		again.Metadata.Set(outbox.MetadataOrderingKey, "order-1")
		again.Metadata.Set(middleware.ReasonForPoisonedKey, "another reason")
		if err := poisonPub.Publish("orders_poison", again); err != nil {
			t.Fatalf("poisoning the same event again: %v", err)
		}
		select {
		case m := <-poisoned:
			t.Errorf("poisoned twice: %s", m.UUID)
		case <-time.After(300 * time.Millisecond):
		}
	})
}

// A PoisonQueue whose Publisher takes the transaction from the message's
// context (NewContextPublisher) cannot publish a delivered message, which
// carries none: the error says so, and the message is nacked and retried,
// not lost.
func TestAdoptionPoisonQueueNeedsATransactionWithAContextPublisher(t *testing.T) {
	db := testdb.New(t, "sqlite")
	store := db.Store(t)
	sub := newSubscriber(t, store, outbox.SubscriberConfig{ConsumerGroup: "billing", MaxAttempts: 2,
		Backoff: func(int) time.Duration { return 10 * time.Millisecond }})
	pub, err := outbox.NewContextPublisher(store)
	if err != nil {
		t.Fatal(err)
	}
	pq, err := middleware.PoisonQueue(pub, "orders_poison")
	if err != nil {
		t.Fatal(err)
	}
	r := newRouter(t, nil)
	r.AddMiddleware(outbox.RecordHandlerError, pq)
	r.AddConsumerHandler("charge", "orders", sub, func(msg *message.Message) error {
		return errors.New("unprocessable order")
	})
	runRouter(t, r)
	uuid := watermill.NewUUID()
	publishAutoCommit(t, store, "orders", message.NewMessage(uuid, []byte("{}")))
	if e := deadLetter(t, store, uuid).LastError; !strings.Contains(e, "carries no transaction") {
		t.Errorf("last error %q does not say the poison publish lacked a transaction", e)
	}
}

// Router.Close while a handler runs: the handler finishes with a live
// message context, its ack is written, Close returns nil, nothing is
// logged at error level, and no event is delivered again.
func TestAdoptionRouterCloseWhileHandling(t *testing.T) {
	forAdoptionDialects(t, func(t *testing.T, db *testdb.Database, store *outbox.Store) {
		logs := testlog.NewCapture()
		sub := newSubscriber(t, store, outbox.SubscriberConfig{ConsumerGroup: "billing", MaxInFlight: 4, Logger: logs})
		r := newRouter(t, logs)
		started := make(chan struct{}, 8)
		var finished, ctxDone atomic.Int32
		r.AddConsumerHandler("charge", "orders", sub, func(msg *message.Message) error {
			started <- struct{}{}
			time.Sleep(time.Second)
			if msg.Context().Err() != nil {
				ctxDone.Add(1)
			}
			finished.Add(1)
			return nil
		})
		done := make(chan error, 1)
		go func() { done <- r.Run(context.Background()) }()
		<-r.Running()
		msgs := make([]*message.Message, 20)
		for i := range msgs {
			msgs[i] = message.NewMessage(watermill.NewUUID(), []byte("{}"))
		}
		publishAutoCommit(t, store, "orders", msgs...)
		for range 4 {
			select {
			case <-started:
			case <-time.After(10 * time.Second):
				t.Fatal("handlers did not start")
			}
		}
		if err := r.Close(); err != nil {
			t.Errorf("Router.Close: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("Router.Run: %v", err)
		}
		if n := finished.Load(); n != 4 {
			t.Errorf("%d handlers finished, want the 4 running at Close", n)
		}
		if n := ctxDone.Load(); n != 0 {
			t.Errorf("%d handlers saw their message context cancelled by Close", n)
		}
		if errs := logs.Captured()[watermill.ErrorLogLevel]; len(errs) > 0 {
			t.Errorf("Close logged errors: %+v", errs)
		}
		delivered := 0
		for _, m := range msgs {
			if findOne(t, store, "orders", m.UUID).Status == outbox.StatusDelivered {
				delivered++
			}
		}
		if delivered != 4 {
			t.Errorf("%d events delivered, want the 4 handled", delivered)
		}
		// The other 16 were released at Close: a new router gets them at
		// once (not after a lease), and not the 4 again.
		again := newSubscriber(t, store, outbox.SubscriberConfig{ConsumerGroup: "billing", MaxInFlight: 16})
		ch, err := again.Subscribe(context.Background(), "orders")
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for len(seen) < 16 {
			select {
			case m := <-ch:
				if seen[m.UUID] {
					t.Fatalf("%s delivered twice", m.UUID)
				}
				seen[m.UUID] = true
				m.Ack()
			case <-time.After(5 * time.Second):
				t.Fatalf("only %d of the 16 released events came back", len(seen))
			}
		}
	})
}

// One Subscriber used by two handlers of one topic: they share its
// consumer group, so they split the events (each handled once), as
// watermill-sql's consumer groups do, not fan out as GoChannel does.
func TestAdoptionTwoHandlersOfOneSubscriberSplitTheEvents(t *testing.T) {
	forAdoptionDialects(t, func(t *testing.T, db *testdb.Database, store *outbox.Store) {
		sub := newSubscriber(t, store, outbox.SubscriberConfig{ConsumerGroup: "billing"})
		r := newRouter(t, nil)
		var mu sync.Mutex
		count := map[string]int{}
		by := map[string]int{}
		for _, name := range []string{"a", "b"} {
			r.AddConsumerHandler(name, "orders", sub, func(msg *message.Message) error {
				time.Sleep(5 * time.Millisecond)
				mu.Lock()
				count[msg.UUID]++
				by[name]++
				mu.Unlock()
				return nil
			})
		}
		runRouter(t, r)
		msgs := make([]*message.Message, 100)
		for i := range msgs {
			msgs[i] = message.NewMessage(watermill.NewUUID(), []byte("{}"))
		}
		publishAutoCommit(t, store, "orders", msgs...)
		waitFor(t, "every event to be handled", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(count) == len(msgs)
		})
		time.Sleep(200 * time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		for id, n := range count {
			if n != 1 {
				t.Errorf("%s handled %d times", id, n)
			}
		}
		if by["a"] == 0 || by["b"] == 0 {
			t.Errorf("handlers took %v: both should share the work", by)
		}
	})
}

// Close is idempotent on both sides; a closed Publisher or Subscriber says
// ErrClosed.
func TestAdoptionCloseIsIdempotent(t *testing.T) {
	store := testdb.New(t, "sqlite").Store(t)
	pub, err := outbox.NewAutoCommitPublisher(store)
	if err != nil {
		t.Fatal(err)
	}
	sub := newSubscriber(t, store, outbox.SubscriberConfig{})
	if _, err := sub.Subscribe(context.Background(), "orders"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := pub.Close(); err != nil {
			t.Fatal(err)
		}
		if err := sub.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Publish("orders", message.NewMessage(watermill.NewUUID(), nil)); !errors.Is(err, outbox.ErrClosed) {
		t.Errorf("Publish after Close: %v, want ErrClosed", err)
	}
	if _, err := sub.Subscribe(context.Background(), "orders"); !errors.Is(err, outbox.ErrClosed) {
		t.Errorf("Subscribe after Close: %v, want ErrClosed", err)
	}
}

// A topic the outbox cannot take as a stream (Watermill allows any
// string) is refused by Publish and by the router's Subscribe, with an
// error that names the topic's rules.
func TestAdoptionTopicRules(t *testing.T) {
	store := testdb.New(t, "sqlite").Store(t)
	pub, err := outbox.NewAutoCommitPublisher(store)
	if err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{"orders/placed", "orders placed", strings.Repeat("t", 129)} {
		err := pub.Publish(topic, message.NewMessage(watermill.NewUUID(), nil))
		if !errors.Is(err, outbox.ErrInvalidKey) || !strings.Contains(err.Error(), "topic") {
			t.Errorf("Publish to %.20q: %v, want ErrInvalidKey naming the topic", topic, err)
		}
	}
	sub := newSubscriber(t, store, outbox.SubscriberConfig{})
	if err := sub.SubscribeInitialize("orders/placed"); !errors.Is(err, outbox.ErrInvalidKey) || !strings.Contains(err.Error(), "topic (the outbox stream) must") {
		t.Errorf("SubscribeInitialize(orders/placed): %v, want ErrInvalidKey naming the topic", err)
	}
	r := newRouter(t, nil)
	r.AddConsumerHandler("h", "orders/placed", sub, func(*message.Message) error { return nil })
	err = r.Run(context.Background())
	// Watermill's own wrapping says "topic" whatever the outbox says: the
	// outbox's part must name it too.
	if !errors.Is(err, outbox.ErrInvalidKey) || !strings.Contains(err.Error(), "topic (the outbox stream) must") {
		t.Errorf("Router.Run with topic orders/placed: %v, want ErrInvalidKey naming the topic", err)
	}
}

// A named consumer group registers when it subscribes, which for a router
// is Router.Run: what was published before reaches only the groups
// registered then (or the default group ""), unlike watermill-sql, whose
// new consumer group reads from the start of the topic. SubscribeInitialize
// run before publishing (at deployment) keeps them for the group.
func TestAdoptionGroupSeesOnlyWhatFollowsItsRegistration(t *testing.T) {
	store := testdb.New(t, "sqlite").Store(t)
	early := watermill.NewUUID()
	publishAutoCommit(t, store, "orders", message.NewMessage(early, []byte("{}")))
	initialized := newSubscriber(t, store, outbox.SubscriberConfig{ConsumerGroup: "shipping"})
	if err := initialized.SubscribeInitialize("orders"); err != nil {
		t.Fatal(err)
	}
	kept := watermill.NewUUID()
	publishAutoCommit(t, store, "orders", message.NewMessage(kept, []byte("{}")))

	got := map[string][]string{}
	var mu sync.Mutex
	r := newRouter(t, nil)
	for _, group := range []string{"billing", "shipping"} {
		sub := initialized
		if group == "billing" {
			sub = newSubscriber(t, store, outbox.SubscriberConfig{ConsumerGroup: group})
		}
		r.AddConsumerHandler(group, "orders", sub, func(msg *message.Message) error {
			mu.Lock()
			got[group] = append(got[group], msg.UUID)
			mu.Unlock()
			return nil
		})
	}
	runRouter(t, r)
	late := watermill.NewUUID()
	publishAutoCommit(t, store, "orders", message.NewMessage(late, []byte("{}")))
	waitFor(t, "billing to get the late event", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got["billing"]) > 0 && len(got["shipping"]) > 1
	})
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if b := strings.Join(got["billing"], ","); b != late {
		t.Errorf("billing (registered by Router.Run) got %s, want only the event published after", b)
	}
	if s := strings.Join(got["shipping"], ","); s != kept+","+late {
		t.Errorf("shipping (SubscribeInitialize first) got %s, want the two events published after it", s)
	}
	// The first event went to the default group, where nobody took it.
	if rec := findOne(t, store, "orders", early); rec.Group != "" || rec.Status != outbox.StatusPending {
		t.Errorf("the early event: group %q, %s; want pending in the default group", rec.Group, rec.Status)
	}
}

// A handler that outlasts the Subscriber's CloseTimeout when the router
// closes: its message context is cancelled then, its late Ack counts for
// nothing, and the event is delivered again after its lease, not lost;
// nothing is logged at error level.
func TestAdoptionHandlerOutlastingCloseTimeoutIsDeliveredAgain(t *testing.T) {
	forAdoptionDialects(t, func(t *testing.T, db *testdb.Database, store *outbox.Store) {
		logs := testlog.NewCapture()
		sub := newSubscriber(t, store, outbox.SubscriberConfig{ConsumerGroup: "billing", Lease: time.Second,
			CloseTimeout: 200 * time.Millisecond, Logger: logs})
		r := newRouter(t, logs)
		started := make(chan struct{}, 1)
		cancelled := make(chan bool, 1)
		r.AddConsumerHandler("charge", "orders", sub, func(msg *message.Message) error {
			started <- struct{}{}
			select {
			case <-msg.Context().Done():
				cancelled <- true
			case <-time.After(3 * time.Second):
				cancelled <- false
			}
			return nil
		})
		done := make(chan error, 1)
		go func() { done <- r.Run(context.Background()) }()
		<-r.Running()
		uuid := watermill.NewUUID()
		publishAutoCommit(t, store, "orders", message.NewMessage(uuid, []byte("{}")))
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			t.Fatal("not handled")
		}
		closed := time.Now()
		if err := r.Close(); err != nil {
			t.Errorf("Router.Close: %v", err)
		}
		<-done
		if !<-cancelled {
			t.Error("the message context was not cancelled at the Subscriber's CloseTimeout")
		}
		if d := time.Since(closed); d > 2*time.Second {
			t.Errorf("Close took %s", d)
		}
		if errs := logs.Captured()[watermill.ErrorLogLevel]; len(errs) > 0 {
			t.Errorf("Close logged errors: %+v", errs)
		}
		if rec := findOne(t, store, "orders", uuid); rec.Status == outbox.StatusDelivered {
			t.Fatal("acknowledged after the close timeout")
		}
		again := newSubscriber(t, store, outbox.SubscriberConfig{ConsumerGroup: "billing"})
		ch, err := again.Subscribe(context.Background(), "orders")
		if err != nil {
			t.Fatal(err)
		}
		select {
		case m := <-ch:
			if m.UUID != uuid || m.Metadata.Get(outbox.MetadataAttempt) != "2" {
				t.Errorf("redelivered %s attempt %s", m.UUID, m.Metadata.Get(outbox.MetadataAttempt))
			}
			m.Ack()
		case <-time.After(5 * time.Second):
			t.Fatal("the event was not delivered again after its lease")
		}
	})
}
