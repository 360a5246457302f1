package tests

import (
	"context"
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
			sub, err := outbox.NewSubscriber(store, outbox.SubscriberConfig{PollInterval: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Close()
			msgs, err := sub.Subscribe(context.Background(), "local")
			if err != nil {
				t.Fatal(err)
			}
			pub, err := outbox.NewAutoCommitPublisher(store)
			if err != nil {
				t.Fatal(err)
			}
			// After Subscribe the subscriber polls at 1, 3, 7, ... 2047,
			// 4095 ms as its claims come back empty: three seconds in, its
			// next poll is more than a second away.
			time.Sleep(3 * time.Second)
			for i := range 2 {
				id := watermill.NewUUID()
				if err := pub.Publish("local", message.NewMessage(id, []byte(`{}`))); err != nil {
					t.Fatal(err)
				}
				select {
				case msg := <-msgs:
					msg.Ack()
					if msg.UUID != id {
						t.Fatalf("event %d: got message %s, want %s", i, msg.UUID, id)
					}
				case <-time.After(500 * time.Millisecond):
					t.Fatalf("event %d: no delivery within 500 ms while the subscriber was between polls: the enqueue did not wake it", i)
				}
				time.Sleep(2 * time.Second) // between polls again
			}
		})
	}
}
