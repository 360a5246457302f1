package outbox

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// maxHeldBatches is the most held claims a subscription keeps open at once
// (SubscriberConfig.HoldClaims): one whose messages are being handled, the
// next queued behind it and a third being claimed. Each keeps a pooled
// connection until it settles.
const maxHeldBatches = 3

// heldSlotWait is how long the claimer waits for one of its held batches to
// settle before it claims the next batch under a lease instead: a slow
// handler must not stop the subscription's other dispatchers.
const heldSlotWait = 200 * time.Millisecond

// heldBatch is one held claim of a subscription: it settles, in the
// claim's transaction, once every event it holds has an outcome (acked,
// nacked, or never handed out because the subscription stopped), or after
// Lease/3 at the latest (settleEarly), when the events still without an
// outcome become leased claims.
type heldBatch struct {
	claim   *HeldClaim
	claimed time.Time
	done    chan struct{} // closed when the batch has every outcome: stops its timer
	// converted is closed once an early settle has ended (leased then
	// holds the claim keys of the events it leased; nil if it failed).
	converted chan struct{}
	leased    map[int64]string
	// lost: the batch's transaction failed to settle, so its events are
	// due again; its events not handed out yet are left, not delivered.
	lost atomic.Bool

	// Under the subscription's mu:
	open      map[int64]Claimed // events without an outcome yet
	early     bool              // settled early: later outcomes go the leased way
	delivered []int64
	kinds     map[string]int // delivered events per kind, for metrics
	failed    []heldFailure
	ordered   bool // a delivered event has an ordering key
}

// queued is a claimed event waiting for a dispatcher, with its held batch
// (nil for a leased event). The batch travels with the event, not in a
// map by event id: when a held batch's transaction is ended under it, its
// events are due again and the subscription may hold the same event in a
// second batch while the first still waits for its outcomes.
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

// claimHeld takes a held claim of up to req.Limit events and returns its
// batch. When none of the subscription's slots frees up within heldSlotWait,
// or the store has no room for another held claim, it claims under a lease
// instead (and returns no batch). False when the subscription stops while
// waiting for a slot.
func (sub *subscription) claimHeld(req ClaimRequest) (*heldBatch, []Claimed, bool, error) {
	slot := false
	select {
	case sub.slots <- struct{}{}:
		slot = true
	default:
		wait := time.NewTimer(heldSlotWait)
		select {
		case sub.slots <- struct{}{}:
			slot = true
		case <-wait.C:
		case <-sub.stop:
			wait.Stop()
			return nil, nil, false, nil
		}
		wait.Stop()
	}
	if !slot || !sub.store.tryHold() {
		if slot {
			<-sub.slots
		}
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
	b := &heldBatch{
		claim: h, claimed: time.Now(), done: make(chan struct{}), converted: make(chan struct{}),
		open: make(map[int64]Claimed, len(cs)), kinds: map[string]int{},
	}
	for _, c := range cs {
		b.open[c.ID] = c
	}
	go sub.ageHeld(b)
	return b, cs, true, nil
}

// endHeld frees the room a held claim took, once its transaction ended.
func (sub *subscription) endHeld() {
	<-sub.slots
	sub.store.unhold()
}

// ageHeld settles a batch early once it has been open for Lease/3 (its
// acks should not wait for a slow sibling, nor its transaction for the
// database's idle limit, which is Lease).
func (sub *subscription) ageHeld(b *heldBatch) {
	timer := time.NewTimer(sub.cfg.Lease / 3)
	defer timer.Stop()
	select {
	case <-b.done:
	case <-timer.C:
		sub.settleEarly(b)
	}
}

// settleEarly settles a batch whose messages are not all settled: the
// outcomes known are settled as at the end, and the events still open
// become leased claims, whose later outcomes take the leased path (acks
// through the acknowledger, Nacks through Fail, extensions by the
// extender).
func (sub *subscription) settleEarly(b *heldBatch) {
	sub.mu.Lock()
	if len(b.open) == 0 {
		sub.mu.Unlock()
		return // the last outcome came meanwhile: the usual settle runs
	}
	b.early = true
	open := make([]Claimed, 0, len(b.open))
	for _, c := range b.open {
		open = append(open, c)
	}
	sub.settling.Add(1) // under mu, as heldDone's: before run's Wait
	sub.mu.Unlock()
	defer sub.settling.Done()
	defer close(b.converted)
	keys := sub.settleHeld(b, open)
	if keys == nil {
		return
	}
	sub.mu.Lock()
	for _, c := range open {
		r := Receipt{ID: c.ID, ClaimKey: keys[c.ID]}
		sub.held[c.ID] = r // extended from now on
		sub.kinds[c.ID] = c.Kind
		if c.OrderingKey != "" {
			sub.ordered[c.ID] = true
		}
	}
	b.leased = keys
	sub.mu.Unlock()
	sub.logger.Debug("Held batch settled early; its unsettled events are leased", watermill.LogFields{"unsettled": len(open), "age": time.Since(b.claimed).String()})
}

// heldDone records the outcome of one held event; the last outcome of a
// batch settles it, in a goroutine of its own.
func (sub *subscription) heldDone(q queued, outcome heldOutcome, msg *message.Message) {
	b, c := q.batch, q.c
	sub.mu.Lock()
	if b.early {
		sub.mu.Unlock()
		sub.leasedDone(b, c, outcome, msg)
		return
	}
	delete(b.open, c.ID)
	switch outcome {
	case heldDelivered:
		b.delivered = append(b.delivered, c.ID)
		b.kinds[c.Kind]++
		b.ordered = b.ordered || c.OrderingKey != ""
	case heldFailed:
		b.failed = append(b.failed, heldFailure{c: c, msg: msg})
	}
	last := len(b.open) == 0
	if last {
		sub.settling.Add(1) // under mu: run waits for it after the dispatchers stop
	}
	sub.mu.Unlock()
	if last {
		close(b.done)
		go func() {
			defer sub.settling.Done()
			sub.settleHeld(b, nil)
		}()
	}
}

// leasedDone records the outcome of an event its batch leased when it
// settled early, as a leased claim's.
func (sub *subscription) leasedDone(b *heldBatch, c Claimed, outcome heldOutcome, msg *message.Message) {
	<-b.converted
	key, ok := b.leased[c.ID]
	if !ok {
		return // the early settle failed: the event is due again
	}
	c.ClaimKey = key
	switch outcome {
	case heldDelivered:
		sub.queueAck(c)
	case heldFailed:
		sub.fail(c, msg)
	default:
		sub.release(c.Receipt())
	}
}

// settleHeld ends a held batch: one statement marks the acked events
// delivered; nacked ones (and lease, the events still open at an early
// settle) become leased claims, the nacked ones failed as such; the rest
// stay due. It returns the claim keys of the leased events, nil when the
// batch could not be settled.
func (sub *subscription) settleHeld(b *heldBatch, lease []Claimed) map[int64]string {
	sub.mu.Lock()
	delivered, failed, kinds, ordered := b.delivered, b.failed, b.kinds, b.ordered
	b.delivered, b.failed, b.kinds = nil, nil, map[string]int{}
	sub.mu.Unlock()
	if len(failed) > 0 || len(lease) > 0 || ordered {
		// Rows of the batch become due (retries after their backoff,
		// leased ones when their lease ends) or pending (keys' next
		// events) below the claim bound; an aborted or lost batch leaves
		// all of its rows due.
		defer sub.bound.Drop()
	}
	if len(delivered) == 0 && len(failed) == 0 && len(lease) == 0 {
		sub.bound.Drop()
		sub.tel.heldBatchEnded(sub.ctx, "aborted")
		sub.abortHeld(b)
		return nil
	}
	ids := make([]int64, 0, len(failed)+len(lease))
	for _, f := range failed {
		ids = append(ids, f.c.ID)
	}
	for _, c := range lease {
		ids = append(ids, c.ID)
	}
	ctx, cancel := sub.opCtx()
	rs, err := b.claim.Settle(ctx, delivered, ids)
	cancel()
	sub.endHeld() // the transaction ended: the failures below are leased claims
	if err != nil {
		sub.bound.Drop()
		b.lost.Store(true)
		sub.tel.heldBatchEnded(sub.ctx, "lost")
		_ = b.claim.Abort()
		sub.logger.Error("Could not settle a held batch; its events will be delivered again (nacked ones without their backoff)", err,
			watermill.LogFields{"acked": len(delivered), "nacked": len(failed), "unsettled": len(lease)})
		return nil
	}
	if len(lease) > 0 {
		sub.tel.heldBatchEnded(sub.ctx, "settled_early")
	} else {
		sub.tel.heldBatchEnded(sub.ctx, "settled")
	}
	for kind, n := range kinds {
		sub.tel.acknowledged(sub.ctx, kind, n)
	}
	if ordered {
		// The next events of their keys became claimable, below the
		// claim bound: the claim this wakes starts from the oldest (the
		// deferred drop would come after it).
		sub.bound.Drop()
		sub.store.wake.notifyGroup(sub.topic, sub.cfg.ConsumerGroup)
	}
	keys := make(map[int64]string, len(rs))
	for _, r := range rs {
		keys[r.ID] = r.ClaimKey
	}
	for _, f := range failed {
		f.c.ClaimKey = keys[f.c.ID]
		sub.fail(f.c, f.msg)
	}
	return keys
}

// abortHeld ends a batch that settles nothing. A rollback has no deadline
// of its own, so it runs aside: a Close waits for it at most as long as
// for any statement of the subscription.
func (sub *subscription) abortHeld(b *heldBatch) {
	ended := make(chan struct{})
	go func() {
		err := b.claim.Abort()
		sub.endHeld()
		if err != nil {
			sub.logger.Error("Could not end a held batch; its events are due again once the database ends it", err, nil)
		}
		close(ended)
	}()
	timer := time.NewTimer(max(sub.cfg.Lease/2, 5*time.Second))
	defer timer.Stop()
	select {
	case <-ended:
	case <-timer.C:
		sub.logger.Error("A held batch's rollback is still running; its events are due again once it ends", nil, nil)
	}
}

// heldContext is the message context's delivery value for a held event: it
// names the store but has no receipt, since the event has no claim key
// until its batch settles. (The value is the same for every held event of
// the store: boxed once.)
func (sub *subscription) heldContext(ctx context.Context) context.Context {
	return context.WithValue(ctx, receiptKey{}, sub.store.heldDelivery)
}
