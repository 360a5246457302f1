package outbox

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// maxHeldBatches is the most held claims a subscription keeps open at once
// (SubscriberConfig.HoldClaims): one whose messages are being handled, the
// next queued behind it and a third being claimed. Each keeps a pooled
// connection until its last message is settled.
const maxHeldBatches = 3

// heldBatch is one held claim of a subscription: it settles, in the
// claim's transaction, once every event it holds has an outcome (acked,
// nacked, or never handed out because the subscription stopped).
type heldBatch struct {
	claim *HeldClaim
	done  chan struct{} // closed when the batch has every outcome: stops the keep-alive
	// Under the subscription's mu:
	open      int // events without an outcome yet
	delivered []int64
	kinds     map[string]int // delivered events per kind, for metrics
	failed    []heldFailure
	ordered   bool // a delivered event has an ordering key
}

// queued is a claimed event waiting for a dispatcher, with its held batch
// (nil for a leased event). The batch travels with the event, not in a
// map by event id: when a held batch's transaction is ended under it (the
// database's idle limit), its events are due again and the subscription
// may hold the same event in a second batch while the first still waits
// for its outcomes.
type queued struct {
	c     Claimed
	batch *heldBatch
}

// heldFailure is a nacked event of a held batch: Settle leases it, then it
// is failed as a leased claim is (retry after Backoff, dead letter at the
// limit).
type heldFailure struct {
	c   Claimed
	msg *message.Message
}

// heldOutcome is what became of one held event.
type heldOutcome uint8

const (
	heldLeft      heldOutcome = iota // not handed out, or not settled in time: due again, unchanged
	heldDelivered                    // acked
	heldFailed                       // nacked
)

// holding reports whether the subscription holds its claims.
func (sub *subscription) holding() bool { return sub.slots != nil }

// claimHeld takes a held claim of up to req.Limit events, once a slot is
// free, and returns its batch; when the store has no room for another held
// claim it claims under a lease instead (and returns no batch). False when
// the subscription stops while waiting for a slot.
func (sub *subscription) claimHeld(req ClaimRequest) (*heldBatch, []Claimed, bool, error) {
	select {
	case sub.slots <- struct{}{}:
	case <-sub.stop:
		return nil, nil, false, nil
	}
	if !sub.store.tryHold() {
		// The store's held claims are all open (see heldBudget): this
		// batch is claimed under a lease, as without HoldClaims.
		<-sub.slots
		ctx, cancel := sub.opCtx()
		cs, err := sub.store.Claim(ctx, req)
		cancel()
		return nil, cs, true, err
	}
	ctx, cancel := sub.opCtx()
	h, cs, err := sub.store.ClaimHeld(ctx, req)
	cancel()
	if h == nil {
		sub.endHeld()
		return nil, nil, true, err
	}
	b := &heldBatch{claim: h, done: make(chan struct{}), open: len(cs), kinds: map[string]int{}}
	go sub.keepHeld(b)
	return b, cs, true, nil
}

// endHeld frees the room a held claim took, once its transaction ended.
func (sub *subscription) endHeld() {
	<-sub.slots
	sub.store.unhold()
}

// keepHeld keeps a held batch's transaction from being ended as idle while
// its messages are handled (as the leased mode extends leases): it touches
// it every Lease/3 until the batch has every outcome.
func (sub *subscription) keepHeld(b *heldBatch) {
	ticker := time.NewTicker(sub.cfg.Lease / 3)
	defer ticker.Stop()
	for {
		select {
		case <-b.done:
			return
		case <-ticker.C:
		}
		ctx, cancel := sub.opCtx()
		err := b.claim.Touch(ctx)
		cancel()
		if err != nil {
			select {
			case <-b.done: // settled meanwhile
			default:
				sub.logger.Error("A held batch's transaction ended before its messages were settled; its events will be delivered again", err, nil)
			}
			return
		}
	}
}

// heldDone records the outcome of one held event; the last outcome of a
// batch settles it, in a goroutine of its own.
func (sub *subscription) heldDone(q queued, outcome heldOutcome, msg *message.Message) {
	b, c := q.batch, q.c
	sub.mu.Lock()
	switch outcome {
	case heldDelivered:
		b.delivered = append(b.delivered, c.ID)
		b.kinds[c.Kind]++
		b.ordered = b.ordered || c.OrderingKey != ""
	case heldFailed:
		b.failed = append(b.failed, heldFailure{c: c, msg: msg})
	}
	b.open--
	last := b.open == 0
	if last {
		sub.settling.Add(1) // under mu: run waits for it after the dispatchers stop
	}
	sub.mu.Unlock()
	if last {
		close(b.done)
		go func() {
			defer sub.settling.Done()
			sub.settleHeld(b)
		}()
	}
}

// settleHeld ends a held batch: one statement marks the acked events
// delivered; nacked ones become leased claims and are failed as such; the
// rest stay due.
func (sub *subscription) settleHeld(b *heldBatch) {
	if len(b.delivered) == 0 && len(b.failed) == 0 {
		err := b.claim.Abort()
		sub.endHeld()
		if err != nil {
			sub.logger.Error("Could not end a held batch; its events are due again once the database ends it", err, nil)
		}
		return
	}
	lease := make([]int64, len(b.failed))
	for i, f := range b.failed {
		lease[i] = f.c.ID
	}
	ctx, cancel := sub.opCtx()
	rs, err := b.claim.Settle(ctx, b.delivered, lease)
	cancel()
	sub.endHeld() // the transaction ended: the failures below are leased claims
	if err != nil {
		_ = b.claim.Abort()
		sub.logger.Error("Could not settle a held batch; its events will be delivered again", err, watermill.LogFields{"acked": len(b.delivered), "nacked": len(b.failed)})
		return
	}
	for kind, n := range b.kinds {
		sub.tel.acknowledged(sub.ctx, kind, n)
	}
	if b.ordered {
		// The next events of their keys became claimable.
		sub.store.wake.notifyGroup(sub.topic, sub.cfg.ConsumerGroup)
	}
	keys := make(map[int64]string, len(rs))
	for _, r := range rs {
		keys[r.ID] = r.ClaimKey
	}
	for _, f := range b.failed {
		f.c.ClaimKey = keys[f.c.ID]
		sub.fail(f.c, f.msg)
	}
}

// heldContext is the message context's delivery value for a held event: it
// names the store but has no receipt, since the event has no claim key
// until its batch settles.
func (sub *subscription) heldContext(ctx context.Context) context.Context {
	return context.WithValue(ctx, receiptKey{}, delivery{store: sub.store, held: true})
}
