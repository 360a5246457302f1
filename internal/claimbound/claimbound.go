// Package claimbound keeps the lower bound of a claimer's claims over a
// backlog (outbox.ClaimRequest.After), for the Subscriber and the relay.
//
// A claim steps over every row the claimer has claimed and not yet settled
// on its way to the due ones: those rows stay in the claim index (due while
// a held batch holds them, under a live lease otherwise). Over a backlog,
// claims that come back full therefore set the bound to the largest id they
// took, so that the next claim starts after the rows the claimer holds
// instead of reading them again.
//
// Rows below the bound can become due while it stands: a transaction that
// took its ids before the claim and committed after it, a delay running
// out, a failed event's retry, an expired lease, a released event, the next
// event of an ordering key whose head was acknowledged, another process's
// work. The bound is therefore dropped (the next claim starts from the
// oldest row) when a claim comes back short, when the claimer learns of
// such a row itself (Drop, and RetryAt for a retry's due time), and at the
// latest MaxAge after a claim from the oldest set it: a row below the bound
// waits at most that long, and only while the claimer works through a
// backlog.
package claimbound

import (
	"sync"
	"time"
)

// DefaultMaxAge is the longest a bound lives when Bound.MaxAge is 0.
const DefaultMaxAge = 250 * time.Millisecond

// maxRetries is the most retry times a bound remembers; beyond it RetryAt
// drops the bound at once.
const maxRetries = 1024

// Bound is one claimer's claim bound; its zero value claims from the
// oldest row. It is safe for concurrent use: the claimer calls Next and
// Claimed, anything that makes rows due below the bound calls Drop or
// RetryAt.
type Bound struct {
	// MaxAge is the longest a bound lives after a claim from the oldest
	// set it (raising it does not extend it); 0 means DefaultMaxAge. Set
	// it before the first claim.
	MaxAge time.Duration

	mu      sync.Mutex
	after   int64     // 0: claim from the oldest
	since   time.Time // when a claim from the oldest set after
	gen     uint64    // counts drops: a claim begun before one does not set the bound
	retries []time.Time
}

// Next returns the bound for a claim beginning at now (0: from the
// oldest), and the generation to hand back to Claimed.
func (b *Bound) Next(now time.Time) (after int64, gen uint64) {
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
	maxAge := b.MaxAge
	if maxAge == 0 {
		maxAge = DefaultMaxAge
	}
	if due || (b.after != 0 && now.Sub(b.since) >= maxAge) {
		b.dropLocked()
	}
	return b.after, b.gen
}

// Claimed records a claim that began at began with the bound after (and
// the generation gen from Next) and took n rows, the largest id largest,
// of at most limit. A full claim sets or raises the bound unless it was
// dropped meanwhile; a short one drops it.
func (b *Bound) Claimed(began time.Time, after int64, gen uint64, n, limit int, largest int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case n < limit || limit <= 0:
		b.dropLocked()
	case gen != b.gen:
		// dropped while the claim ran: the next claim starts from the oldest
	case b.after == 0 && after == 0:
		b.after, b.since = largest, began
	case b.after != 0:
		b.after = max(b.after, largest)
	}
}

// Drop makes the next claim start from the oldest row.
func (b *Bound) Drop() {
	b.mu.Lock()
	b.dropLocked()
	b.mu.Unlock()
}

func (b *Bound) dropLocked() {
	b.after = 0
	b.gen++
}

// RetryAt records that a row the claimer failed becomes due at t: the
// first claim from then on starts from the oldest row.
func (b *Bound) RetryAt(t time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.retries) >= maxRetries {
		b.dropLocked()
		return
	}
	b.retries = append(b.retries, t)
}
