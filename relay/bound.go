package relay

import (
	"sync"
	"time"
)

// maxBoundAge is the longest a claim bound lives: after it the next claim
// starts from the oldest event again (a variable for tests).
var maxBoundAge = 250 * time.Millisecond

// maxBoundRetries is the most retry times a bound remembers; beyond it a
// failure drops the bound at once.
const maxBoundRetries = 1024

// claimBound is the lower bound of a pipeline's claims over a backlog
// (outbox.ClaimRequest.After). A claim steps over every event the relay
// holds (claimed, not yet acknowledged: up to Window plus a batch) on its
// way to the due ones; over a backlog, claims that come back full set the
// bound to the largest id they took, so the next claim starts after the
// events the relay holds instead of reading them again.
//
// Events below the bound can become due while it stands: a transaction
// that took its ids before the claim and committed after it, a delay
// running out, a failed publish's retry, an expired lease, a released
// event, the next event of an ordering key whose head was acknowledged,
// another process's work. The bound is therefore dropped (the next claim
// starts from the oldest) when a claim comes back short, when the pipeline
// learns of such an event itself (drop, and retryAt for a retry's due
// time), and at the latest maxBoundAge after a claim from the oldest set
// it: an event below the bound waits at most that long, and only while
// the relay works through a backlog.
type claimBound struct {
	mu      sync.Mutex
	after   int64     // 0: claim from the oldest
	since   time.Time // when a claim from the oldest set after
	gen     uint64    // counts drops: a claim begun before one does not set the bound
	retries []time.Time
}

// next returns the bound for a claim beginning at now, and the generation
// to hand back to claimed.
func (b *claimBound) next(now time.Time) (after int64, gen uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	due := false
	kept := b.retries[:0]
	for _, t := range b.retries {
		if now.Before(t) {
			kept = append(kept, t)
		} else {
			due = true
		}
	}
	b.retries = kept
	if due || (b.after != 0 && now.Sub(b.since) >= maxBoundAge) {
		b.dropLocked()
	}
	return b.after, b.gen
}

// claimed records a claim that began at began with the bound after (and
// generation gen from next) and took n events, the largest largest, of at
// most limit. A full claim sets or raises the bound unless it was dropped
// meanwhile; a short one drops it.
func (b *claimBound) claimed(began time.Time, after int64, gen uint64, n, limit int, largest int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case n < limit:
		b.dropLocked()
	case gen != b.gen:
		// dropped while the claim ran: the next claim starts from the oldest
	case b.after == 0 && after == 0:
		b.after, b.since = largest, began
	case b.after != 0:
		b.after = max(b.after, largest)
	}
}

// drop makes the next claim start from the oldest event.
func (b *claimBound) drop() {
	b.mu.Lock()
	b.dropLocked()
	b.mu.Unlock()
}

func (b *claimBound) dropLocked() {
	b.after = 0
	b.gen++
}

// retryAt records that an event the relay failed becomes due at t: the
// first claim from then on starts from the oldest event.
func (b *claimBound) retryAt(t time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.retries) >= maxBoundRetries {
		b.dropLocked()
		return
	}
	b.retries = append(b.retries, t)
}
