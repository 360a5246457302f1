package tests

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// TestWatermillUniversalPubSub runs Watermill's own universal Pub/Sub suite
// against the outbox on every dialect.
//
// Features claimed, and why:
//   - ConsumerGroups: each group has its own delivery rows.
//   - Persistent: events live in the database until acknowledged.
//   - ExactlyOnceDelivery false: a lease outbox is at-least-once (an event
//     whose lease expires before its ack is delivered again).
//   - GuaranteedOrder false: batches are claimed oldest first, but retries,
//     concurrent subscribers and MaxInFlight > 1 reorder.
//   - NewSubscriberReceivesOldMessages false: an acknowledged event is not
//     delivered again to the same group.
//   - RestartServiceCommand empty: restarting the shared database would break
//     the other suites running in parallel; the fault tests restart it alone.
func TestWatermillUniversalPubSub(t *testing.T) { testWatermillUniversalPubSub(t) }

func testWatermillUniversalPubSub(t *testing.T, opts ...outbox.Option) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			db := testdb.New(t, dialect)
			store := db.Store(t, opts...)
			newPubSub := func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
				pub, err := outbox.NewAutoCommitPublisher(store)
				if err != nil {
					t.Fatal(err)
				}
				sub, err := outbox.NewSubscriber(store, outbox.SubscriberConfig{
					ConsumerGroup: group,
					MaxAttempts:   100,
					Backoff:       func(int) time.Duration { return 0 },
					CloseTimeout:  time.Second,
				})
				if err != nil {
					t.Fatal(err)
				}
				return pub, sub
			}
			tests.TestPubSub(t, tests.Features{
				ConsumerGroups:                   true,
				ExactlyOnceDelivery:              false,
				GuaranteedOrder:                  false,
				Persistent:                       true,
				NewSubscriberReceivesOldMessages: false,
			},
				func(t *testing.T) (message.Publisher, message.Subscriber) { return newPubSub(t, "") },
				newPubSub,
			)
		})
	}
}
