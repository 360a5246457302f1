package tests

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/internal/testlog"
	"github.com/millpond/millpond/outbox"
)

// secretCard is passed on the stack (too many words for registers), where
// a Go traceback prints its fields' values exactly.
type secretCard struct {
	Number, PIN            int64
	A, B, C, D, E, F, G, H int64
}

//go:noinline
func chargeSecretCard(c secretCard) {
	if c.Number > 0 {
		panic("declined")
	}
}

// TestRedactingLoggerHidesWhatTheRouterPrints: besides message UUIDs, a
// Watermill router over an outbox Subscriber logs the stack of a panic it
// recovered, with the values of every frame's arguments (fields of the
// event among them): RedactingLogger writes them as "(...)". The messages
// a handler produced and could not publish are logged too, as pointers
// only: neither their keys, metadata nor payloads show.
func TestRedactingLoggerHidesWhatTheRouterPrints(t *testing.T) {
	const card, pin = 4111111111111111, 4321
	const producedKey, producedPayload, metaValue = "produced-key-Zq81", "produced-payload-Zq82", "meta-value-Zq83"
	db := testdb.New(t, "sqlite")
	store := db.Store(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sub, err := outbox.NewSubscriber(store, outbox.SubscriberConfig{ConsumerGroup: "g", PollInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := outbox.NewContextPublisher(store) // produced messages carry no transaction: refused
	if err != nil {
		t.Fatal(err)
	}
	capture := testlog.NewCapture()
	router, err := message.NewRouter(message.RouterConfig{}, outbox.RedactingLogger(capture))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan string, 4)
	router.AddHandler("produce", "in", sub, "out", pub, func(msg *message.Message) ([]*message.Message, error) {
		if msg.Metadata.Get(outbox.MetadataKind) == "Panic" {
			done <- "panic"
			chargeSecretCard(secretCard{Number: card, PIN: pin})
		}
		out := message.NewMessage(producedKey, []byte(producedPayload))
		out.Metadata.Set("token", metaValue)
		done <- "produce"
		return []*message.Message{out}, nil
	})
	go func() { _ = router.Run(ctx) }()
	<-router.Running()
	tx, commit, _ := db.Begin(t)
	for _, ev := range []outbox.Event{{Stream: "in", Key: "consumed-1", Kind: "Produce", Payload: []byte("{}")},
		{Stream: "in", Key: "consumed-2", Kind: "Panic", Payload: []byte("{}")}} {
		if _, err := store.Enqueue(ctx, tx, ev); err != nil {
			t.Fatal(err)
		}
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for len(seen) < 2 {
		select {
		case s := <-done:
			seen[s] = true
		case <-ctx.Done():
			t.Fatalf("handled %v only", seen)
		}
	}
	time.Sleep(200 * time.Millisecond) // the router logs after the handler returns
	_ = router.Close()
	var logged strings.Builder
	for _, lines := range capture.Captured() {
		for _, l := range lines {
			fmt.Fprintf(&logged, "%s %v %v\n", l.Msg, l.Err, l.Fields)
		}
	}
	out := logged.String()
	for _, secret := range []string{producedKey, producedPayload, metaValue, fmt.Sprintf("%#x", card), fmt.Sprintf("%#x", pin)} {
		if strings.Contains(out, secret) {
			t.Errorf("the router's log shows %q:\n%s", secret, out)
		}
	}
	for _, want := range []string{"Cannot publish messages", "Panic recovered in handler", "chargeSecretCard(...)"} {
		if !strings.Contains(out, want) {
			t.Errorf("the router's log lost %q:\n%s", want, out)
		}
	}
}

// TestRecovererStackIsStrippedInLogsAndStoredFailures: Watermill's
// Recoverer middleware turns a handler's panic into an error whose text
// holds debug.Stack(), with every frame's argument values (here a card
// number). Under RecordHandlerError that text becomes the event's stored
// failure, and the router logs the error: both keep the frames but write
// their arguments as "(...)". The error stays a RecoveredPanicError for
// errors.As.
func TestRecovererStackIsStrippedInLogsAndStoredFailures(t *testing.T) {
	const card, pin = 4111111111111111, 4321
	db := testdb.New(t, "sqlite")
	store := db.Store(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sub, err := outbox.NewSubscriber(store, outbox.SubscriberConfig{ConsumerGroup: "g", PollInterval: 10 * time.Millisecond,
		Backoff: func(int) time.Duration { return time.Hour }})
	if err != nil {
		t.Fatal(err)
	}
	capture := testlog.NewCapture()
	router, err := message.NewRouter(message.RouterConfig{}, outbox.RedactingLogger(capture))
	if err != nil {
		t.Fatal(err)
	}
	router.AddMiddleware(outbox.RecordHandlerError, middleware.Recoverer)
	handled := make(chan struct{}, 1)
	router.AddConsumerHandler("charge", "in", sub, func(msg *message.Message) error {
		handled <- struct{}{}
		chargeSecretCard(secretCard{Number: card, PIN: pin})
		return nil
	})
	go func() { _ = router.Run(ctx) }()
	<-router.Running()
	tx, commit, _ := db.Begin(t)
	if _, err := store.Enqueue(ctx, tx, outbox.Event{Stream: "in", Key: "charge-1", Kind: "Charge", Payload: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-handled:
	case <-ctx.Done():
		t.Fatal("the event was not handled")
	}
	var stored string
	for stored == "" {
		recs, err := store.FindEvents(ctx, outbox.EventQuery{Stream: "in", Key: "charge-1"})
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) == 1 && recs[0].Status == outbox.StatusPending && recs[0].LastError != "" {
			stored = recs[0].LastError
		} else if ctx.Err() != nil {
			t.Fatalf("no failure was stored: %v", recs)
		} else {
			time.Sleep(20 * time.Millisecond)
		}
	}
	_ = router.Close()
	var logged strings.Builder
	var recovered bool
	for _, lines := range capture.Captured() {
		for _, l := range lines {
			fmt.Fprintf(&logged, "%s %+v %v\n", l.Msg, l.Err, l.Fields)
			var p middleware.RecoveredPanicError
			recovered = recovered || errors.As(l.Err, &p)
		}
	}
	for what, text := range map[string]string{"stored failure": stored, "router log": logged.String()} {
		for _, secret := range []string{fmt.Sprintf("%#x", card), fmt.Sprintf("%#x", pin)} {
			if strings.Contains(text, secret) {
				t.Errorf("the %s shows %q:\n%s", what, secret, text)
			}
		}
		for _, want := range []string{"panic occurred", "chargeSecretCard(...)"} {
			if !strings.Contains(text, want) {
				t.Errorf("the %s lost %q:\n%s", what, want, text)
			}
		}
	}
	if !recovered {
		t.Errorf("no logged error is a RecoveredPanicError for errors.As:\n%s", logged.String())
	}
}
