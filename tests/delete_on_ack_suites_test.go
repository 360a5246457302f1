package tests

import (
	"testing"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// runWithDeleteOnAck runs conformance cases against every dialect with
// outbox.WithDeleteOnAck, leaving out those named in skip (they read
// acknowledged rows back, which the option deletes).
func runWithDeleteOnAck(t *testing.T, cases []conformanceCase, skip map[string]string) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			for _, c := range cases {
				if _, ok := skip[c.name]; ok {
					continue
				}
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					e := newEnv(t, dialect, !c.dbClock, outbox.WithDeleteOnAck())
					e.deleteOnAck = true
					c.run(t, e)
				})
			}
		})
	}
}

// TestStoreConformanceDeleteOnAck runs the store conformance suite with
// acknowledgements that delete (expectRow takes "delivered" as "deleted").
// The cases left out read acknowledged rows back; what they check is
// checked with the option in TestDeleteOnAck.
func TestStoreConformanceDeleteOnAck(t *testing.T) {
	runWithDeleteOnAck(t, conformanceCases, map[string]string{
		"ConcurrentClaimersDeliverExactlyOnce": "counts delivered rows at their first attempt (TestDeleteOnAck's Subscriber case counts deliveries)",
		"MultiRowStatementsLockInIDOrder":      "locks an acknowledged row again",
		"ClaimOrderAndBatchAcknowledge":        "reads delivered_at of acknowledged rows",
		"ConsumerGroups":                       "expects the re-enqueue of an event to name its acknowledged row (it names the lowest remaining row)",
		"IdempotentEnqueue":                    "expects the re-enqueue of an acknowledged event to name its row (ID 0 with the option: TestDeleteOnAck's IdempotentReEnqueue)",
	})
}

// TestOrderingDeleteOnAck runs the whole ordering-key suite with
// acknowledgements that delete: the key logic (counting settled heads off,
// promoting and handing the next events over, hold and skip) does not
// need the acknowledged head's row.
func TestOrderingDeleteOnAck(t *testing.T) {
	runWithDeleteOnAck(t, orderingCases, nil)
}

// TestWatermillUniversalPubSubDeleteOnAck runs Watermill's universal
// Pub/Sub suite against stores that delete on acknowledgement.
func TestWatermillUniversalPubSubDeleteOnAck(t *testing.T) {
	testWatermillUniversalPubSub(t, outbox.WithDeleteOnAck())
}
