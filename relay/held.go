package relay

import (
	"context"
	"time"

	"github.com/millpond/millpond/outbox"
)

// maxHeldClaims is the most held claims (batches) a pipeline keeps open at
// once: one being published, the next waiting for the publisher and a
// third being claimed (with two, a small window drained while the next
// claim ran: 0.40-0.47x the bare publish loop at window 256, where leased
// claims reached 0.42-0.54x). Each keeps a pooled connection until its last
// publish is confirmed, and holds at most Window events.
const maxHeldClaims = 3

// heldBatch is one held claim (outbox.Store.ClaimHeld) on its way through
// the pipeline: it settles, in the claim's transaction, once every event it
// holds has an outcome (published, failed, or left unpublished by a stop).
type heldBatch struct {
	claim *outbox.HeldClaim
	// Under the pipeline's mu:
	open      int // events without an outcome yet
	ended     bool
	delivered []int64
	failed    []failedItem
	ordered   bool // a delivered event has an ordering key
}

// takeSlot waits for room for one more held claim; false when the
// pipeline stops first.
func (p *pipeline) takeSlot() bool {
	select {
	case p.slots <- struct{}{}:
		return true
	case <-p.stop:
		return false
	}
}

func (p *pipeline) freeSlot() { <-p.slots }

// openHeld records a held claim of n events.
func (p *pipeline) openHeld(h *outbox.HeldClaim, n int) *heldBatch {
	hb := &heldBatch{claim: h, open: n}
	p.mu.Lock()
	p.open[hb] = struct{}{}
	p.mu.Unlock()
	return hb
}

// heldDone records the outcome of one held event (nil: not published, the
// event stays as it was); the last one settles its batch, in a goroutine
// of its own (finish runs on the broker client's goroutine).
func (p *pipeline) heldDone(it *item, res *result) {
	hb := it.hb
	p.mu.Lock()
	if hb.ended {
		p.mu.Unlock()
		return // the stop settled the batch without this outcome
	}
	switch {
	case res == nil:
	case res.err == nil:
		hb.delivered = append(hb.delivered, it.c.ID)
		hb.ordered = hb.ordered || it.c.OrderingKey != ""
	default:
		hb.failed = append(hb.failed, failedItem{it: it, res: *res})
	}
	hb.open--
	last := hb.open == 0
	if last {
		hb.ended = true
		delete(p.open, hb)
		p.settling.Add(1) // under mu: before endHeld, and so before the stop's Wait
	}
	p.mu.Unlock()
	if last {
		go func() {
			defer p.settling.Done()
			p.settleHeld(hb)
		}()
	}
}

// endHeld settles every held claim still open when the pipeline stops
// after its close timeout, with the outcomes known: events still
// unconfirmed stay as they were and are published again (and dropped as
// duplicates if they had arrived).
func (p *pipeline) endHeld() {
	p.mu.Lock()
	var open []*heldBatch
	for hb := range p.open {
		hb.ended = true
		open = append(open, hb)
		delete(p.open, hb)
	}
	p.mu.Unlock()
	for _, hb := range open {
		p.settleHeld(hb)
	}
}

// settleHeld ends a held claim: it acknowledges the published events,
// leases the failed ones (whose failures are then recorded as a leased
// claim's are) and leaves the others due.
func (p *pipeline) settleHeld(hb *heldBatch) {
	if len(hb.delivered) == 0 && len(hb.failed) == 0 {
		err := hb.claim.Abort()
		p.freeSlot()
		if err != nil {
			p.r.cfg.Logger.Error("relay: could not end a held claim; its events are due again when the database ends it", "error", err.Error())
		}
		p.bound.Drop() // its events are due below the claims' bound
		return
	}
	lease := make([]int64, len(hb.failed))
	for i, f := range hb.failed {
		lease[i] = f.it.c.ID
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(p.r.cfg.Lease/2, 5*time.Second))
	rs, err := hb.claim.Settle(ctx, hb.delivered, lease)
	cancel()
	p.freeSlot() // the transaction ended: the failures below are leased claims
	if err != nil {
		p.r.cfg.Logger.Error("relay: could not acknowledge published events; they will be published again (and dropped as duplicates)",
			"error", err.Error(), "events", len(hb.delivered))
		p.bound.Drop() // the batch's events are due again, below the claims' bound
		return
	}
	if hb.ordered {
		// The next events of their keys became claimable, below the bound.
		p.bound.Drop()
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}
	keys := make(map[int64]string, len(rs))
	for _, r := range rs {
		keys[r.ID] = r.ClaimKey
	}
	for _, f := range hb.failed {
		f.it.c.ClaimKey = keys[f.it.c.ID]
		p.settleFailure(f)
	}
}
