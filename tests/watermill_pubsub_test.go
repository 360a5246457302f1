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

// TestWatermillUniversalPubSubHoldClaims runs the suite against a
// Subscriber that holds its claims (SubscriberConfig.HoldClaims), which
// PostgreSQL and MariaDB offer.
// Its store's pool has 20 connections, so up to 5 batches are held at once
// and the suite's many concurrent subscribers also claim under leases.
func TestWatermillUniversalPubSubHoldClaims(t *testing.T) {
	testUniversalSuite(t, []string{"postgres", "mysql"}, func(c *outbox.SubscriberConfig) { c.HoldClaims, c.HoldClaimsAfter = true, -1 })
}

func testWatermillUniversalPubSub(t *testing.T, opts ...outbox.Option) {
	testUniversalSuite(t, testdb.Dialects, nil, opts...)
}

// testUniversalSuite runs Watermill's suite on the dialects, with the
// subscriber's configuration adjusted by hold when it is not nil (over a
// store of its own with a pool of 20 connections).
func testUniversalSuite(t *testing.T, dialects []string, hold func(*outbox.SubscriberConfig), opts ...outbox.Option) {
	for _, dialect := range dialects {
		t.Run(dialect, func(t *testing.T) {
			db := testdb.New(t, dialect)
			store := db.Store(t, opts...)
			if hold != nil {
				store = poolStore(t, db, 20)
			}
			newPubSub := func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
				pub, err := outbox.NewAutoCommitPublisher(store)
				if err != nil {
					t.Fatal(err)
				}
				cfg := outbox.SubscriberConfig{
					ConsumerGroup: group,
					MaxAttempts:   100,
					Backoff:       func(int) time.Duration { return 0 },
					CloseTimeout:  time.Second,
				}
				if hold != nil {
					hold(&cfg)
				}
				sub, err := outbox.NewSubscriber(store, cfg)
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
