package tests

import (
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// TestInProcessEnqueueWakesItsSubscribers shows that an enqueue wakes the
// subscribers of its own process when no NOTIFY will: on MySQL and SQLite,
// and on a PostgreSQL store that does not listen. The poll interval is set
// far beyond the deadline, so polling cannot explain the delivery.
func TestInProcessEnqueueWakesItsSubscribers(t *testing.T) {
	cases := []struct {
		dialect string
		opts    []outbox.Option
	}{
		{"postgres", []outbox.Option{outbox.WithoutListen()}},
		{"mysql", nil},
		{"sqlite", nil},
	}
	for _, c := range cases {
		t.Run(c.dialect, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, c.dialect)
			store := db.Store(t, c.opts...)
			msgs := idleSubscription(t, store, "local")
			pub, err := outbox.NewAutoCommitPublisher(store)
			if err != nil {
				t.Fatal(err)
			}
			// After Subscribe the subscriber polls at 1, 3, 7, ... 2047,
			// 4095 ms as its claims come back empty: three seconds in, its
			// next poll is more than a second away.
			time.Sleep(3 * time.Second)
			for i := range 2 {
				publishAndReceive(t, pub, msgs, "local", fmt.Sprintf("event %d", i), "the enqueue did not wake it")
				time.Sleep(2 * time.Second) // between polls again
			}
		})
	}
}

// idleSubscription subscribes to stream with a poll interval of a minute, so
// that a delivery soon after the subscriber has gone idle can only come from
// a wake-up. The subscriber closes at the end of the test.
func idleSubscription(t *testing.T, store *outbox.Store, stream string) <-chan *message.Message {
	t.Helper()
	_, msgs := subscribe(t, store, outbox.SubscriberConfig{PollInterval: time.Minute}, stream)
	return msgs
}

// publishAndReceive publishes one new event and requires it to arrive on
// msgs within 500 ms (why names what failed otherwise); it returns the time
// from publishing to receiving.
func publishAndReceive(t *testing.T, pub message.Publisher, msgs <-chan *message.Message, stream, label, why string) time.Duration {
	t.Helper()
	id := watermill.NewUUID()
	start := time.Now()
	if err := pub.Publish(stream, message.NewMessage(id, []byte(label))); err != nil {
		t.Fatal(err)
	}
	select {
	case msg := <-msgs:
		msg.Ack()
		if msg.UUID != id {
			t.Fatalf("%s: got message %s, want %s", label, msg.UUID, id)
		}
		return time.Since(start)
	case <-time.After(500 * time.Millisecond):
		t.Fatalf("%s: no delivery within 500 ms while the subscriber was between polls: %s", label, why)
		return 0
	}
}
