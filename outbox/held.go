package outbox

import (
	"context"
	"fmt"

	"github.com/millpond/millpond/internal/sqlcore"
)

// ErrHeldSettled reports a HeldClaim used after Settle or Abort ended it.
var ErrHeldSettled = sqlcore.ErrHeldSettled

// HeldClaim is a claim that holds its events in an open database
// transaction instead of writing a lease (Store.ClaimHeld): the events'
// rows stay locked, and unchanged, until Settle or Abort ends the
// transaction. Other claims skip them as they skip leased events. If the
// holder dies its session ends and the events are due again at once,
// unchanged (the attempt is not counted); if its transaction stays idle
// longer than the request's Lease, the database ends it with the same
// effect (PostgreSQL: idle_in_transaction_session_timeout; MySQL: the
// session's wait_timeout, set to the Lease in whole seconds, rounded up,
// while the claim is held and restored when it ends).
//
// A held claim uses one pooled connection until it ends: keep few open at
// once, and end each promptly (it also holds back the database's cleanup
// of old row versions while open). Its methods are safe for concurrent use.
type HeldClaim struct {
	core *sqlcore.Held
}

// ClaimHeld takes up to req.Limit due events, oldest first, as Claim does,
// but holds them (see HeldClaim) instead of writing a lease: a delivered
// event's row is then written once, at Settle, instead of at the claim and
// again at its acknowledgement. It suits a consumer that settles a whole
// batch within seconds, such as a relay to a broker. The events come back
// with Attempts counting this attempt, an empty ClaimKey (they have no
// receipt until Settle leases them) and LeaseExpiresAt the latest the claim
// may stay idle (req.Lease from now). With no due event it returns no
// events and a nil *HeldClaim.
//
// PostgreSQL and MySQL/MariaDB hold claims; on SQLite the error wraps
// errors.ErrUnsupported.
func (s *Store) ClaimHeld(ctx context.Context, req ClaimRequest) (*HeldClaim, []Claimed, error) {
	if err := s.ready(ctx); err != nil {
		return nil, nil, err
	}
	h, out, err := s.core.ClaimHeld(ctx, sqlcore.ClaimRequest(req))
	if err != nil {
		return nil, nil, fmt.Errorf("outbox: held claim: %w", err)
	}
	if h == nil {
		return nil, nil, nil
	}
	return &HeldClaim{core: h}, convert(out, claimedFromCore), nil
}

// Settle ends the held claim and commits. The events of delivered are
// acknowledged (marked delivered, or deleted under WithDeleteOnAck; an
// event with an ordering key hands its key to the next event, as
// Acknowledge does). The events of lease become ordinary claims under the
// request's Lease, with one more attempt and a fresh claim key: their
// receipts, returned, are then settled as any claim's (Fail, Acknowledge,
// Release). Every other held event is left unchanged, due again. An id the
// claim does not hold, or named twice, is refused with ErrInvalidID and the
// claim stays open. When the commit fails nothing is settled.
func (h *HeldClaim) Settle(ctx context.Context, delivered, lease []int64) ([]Receipt, error) {
	rs, err := h.core.Settle(ctx, delivered, lease)
	if err != nil {
		return nil, fmt.Errorf("outbox: settle a held claim of %d delivered and %d leased events: %w", len(delivered), len(lease), err)
	}
	return convert(rs, receiptFromCore), nil
}

// Abort ends the held claim without settling anything: its events are due
// again, unchanged. Aborting an ended claim does nothing.
func (h *HeldClaim) Abort() error {
	if err := h.core.Abort(); err != nil {
		return fmt.Errorf("outbox: abort a held claim: %w", err)
	}
	return nil
}

// heldBudget is the most held claims a store's subscribers keep open at
// once (SubscriberConfig.HoldClaims): a quarter of the pool's connections,
// at least one; unlimitedHeld when the pool has no limit (maxConns 0, a
// database/sql pool's default). Each held claim keeps a connection until
// its batch settles, so without a bound subscriptions (or handlers that
// need a connection to finish) could wait for connections that held
// claims keep.
func heldBudget(maxConns int) int {
	if maxConns <= 0 {
		return unlimitedHeld
	}
	return max(1, maxConns/4)
}

// unlimitedHeld is the held-claim budget of a pool without a connection
// limit: each held claim is still a database session.
const unlimitedHeld = 8

// tryHold takes room for one more held claim of a subscriber, if there is
// any; unhold gives it back.
func (s *Store) tryHold() bool {
	select {
	case s.heldBudget <- struct{}{}:
		return true
	default:
		return false
	}
}

func (s *Store) unhold() { <-s.heldBudget }
