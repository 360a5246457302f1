package bus_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millpond/millpond/bus"
	"github.com/millpond/millpond/handlers"
	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// TestRouterLogsNoEventKeys: Watermill's router logs a failed handling with
// the message's UUID, which for an outbox message is the event key (may be
// customer data). Through the bus that field is redacted, at every level.
func TestRouterLogsNoEventKeys(t *testing.T) {
	db := testdb.New(t, "sqlite")
	store := db.Store(t)
	var attempts atomic.Int64
	h := handlers.New("flaky", "orders", "OrderPlaced", func(ctx context.Context, ev orderPlaced, meta handlers.Meta) error {
		if attempts.Add(1) == 1 {
			return fmt.Errorf("the first attempt fails")
		}
		return nil
	}, handlers.WithBackoff(func(int) time.Duration { return 0 }))
	logs := watermill.NewCaptureLogger()
	startBus(t, store, bus.Config{Subscriber: fastSubscriber, Logger: logs}, h)

	const key = "customer-ada.example.com"
	tx, commit, _ := db.Begin(t)
	if _, err := store.Enqueue(context.Background(), tx, outbox.Event{Stream: "orders", Key: key, Kind: "OrderPlaced", Payload: order(1)}); err != nil {
		t.Fatal(err)
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the second attempt", func() bool { return attempts.Load() >= 2 })

	sawHandlerError, sawRedacted := false, false
	for level, msgs := range logs.Captured() {
		for _, m := range msgs {
			line := fmt.Sprintf("%d %s %v %v", level, m.Msg, m.Err, m.Fields)
			if strings.Contains(line, key) {
				t.Errorf("a log line holds the event key: %s", line)
			}
			if m.Msg == "Handler returned error" {
				sawHandlerError = true
			}
			if m.Fields["message_uuid"] == outbox.RedactedField {
				sawRedacted = true
			}
		}
	}
	if !sawHandlerError || !sawRedacted {
		t.Fatalf("the router logged no handler error with a redacted message_uuid (error %v, redacted %v)", sawHandlerError, sawRedacted)
	}
}

type signup struct {
	Email    string    `json:"email"`
	Birthday time.Time `json:"birthday"`
	Amount   int       `json:"amount,string"`
	Card     string    `json:"card"`
}

// TestUndecodablePayloadReasonHoldsNoPayload: a payload that does not decode
// into the handler's type is dead-lettered with a reason that says where
// and what failed, but encoding/json's own message quotes payload values
// (a time that does not parse, a ",string" field, a number's literal), and
// the reason is last_error (ListDead, the CLI, the admin UI) and the
// router's log line: none of it may hold payload content.
func TestUndecodablePayloadReasonHoldsNoPayload(t *testing.T) {
	db := testdb.New(t, "sqlite")
	store := db.Store(t)
	h := handlers.New("signup-mailer", "signups", "SignedUp", func(context.Context, signup, handlers.Meta) error {
		return nil
	})
	logs := watermill.NewCaptureLogger()
	startBus(t, store, bus.Config{Subscriber: fastSubscriber, Logger: logs}, h)

	secrets := []string{"ada.lovelace@example.com", "card-4111111111111111", "4111111111111111"}
	publish(t, db, store, "signups", "SignedUp",
		[]byte(`{"email":"x","birthday":"`+secrets[0]+`"}`),
		[]byte(`{"email":"x","amount":"`+secrets[1]+`"}`),
		[]byte(`{"email":"x","card":`+secrets[2]+`}`))

	var dead []outbox.DeadEvent
	waitFor(t, "three dead letters", func() bool {
		var err error
		dead, err = store.ListDead(context.Background(), outbox.DeadQuery{Stream: "signups", Group: "signup-mailer", Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		return len(dead) == 3
	})
	typeMismatch := false
	for _, d := range dead {
		for _, s := range secrets {
			if strings.Contains(d.LastError, s) {
				t.Errorf("dead letter %d's last error holds payload content: %q", d.ID, d.LastError)
			}
		}
		if !strings.Contains(d.LastError, "decode SignedUp payload into bus_test.signup") {
			t.Errorf("dead letter %d's last error does not say what failed: %q", d.ID, d.LastError)
		}
		typeMismatch = typeMismatch || strings.HasSuffix(d.LastError, "a JSON number at byte offset 36 cannot be a Go string")
	}
	if !typeMismatch {
		t.Errorf("no reason names the JSON number that is not a string: %v", dead)
	}
	for _, msgs := range logs.Captured() {
		for _, m := range msgs {
			line := fmt.Sprintf("%s %v %v", m.Msg, m.Err, m.Fields)
			for _, s := range secrets {
				if strings.Contains(line, s) {
					t.Errorf("a log line holds payload content: %s", line)
				}
			}
		}
	}
}
