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
