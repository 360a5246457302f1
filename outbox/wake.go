package outbox

import (
	"sync"
	"time"
)

// wakeHub fans PostgreSQL notifications out to the subscribers of this
// process. A notification only hints that a stream may have due events;
// subscribers also poll, so a lost hint delays but never loses an event.
type wakeHub struct {
	listening bool
	mu        sync.Mutex
	waiters   map[string]map[chan struct{}]waiter // stream -> channel -> whose
}

// waiter is whom a wake-up channel serves: one consumer group, or any.
// soon, when set, takes the hints of this process's enqueues (notifySoon)
// instead of the channel itself.
type waiter struct {
	group string
	any   bool
	soon  chan struct{}
}

func newWakeHub() *wakeHub {
	return &wakeHub{waiters: map[string]map[chan struct{}]waiter{}}
}

// subscribe returns a channel signalled when stream may have due events
// for any consumer group, and a function that stops the signals.
func (h *wakeHub) subscribe(stream string) (<-chan struct{}, func()) {
	return h.add(stream, waiter{any: true})
}

// subscribeGroup is subscribe for one consumer group: it is not signalled
// when only another group's events became claimable (notifyGroup). The
// enqueues of this process, whose transactions have not committed yet when
// they signal (notifySoon), signal the second channel, soon, instead: the
// first channel tells of events that are claimable now.
func (h *wakeHub) subscribeGroup(stream, group string) (wake, soon <-chan struct{}, stop func()) {
	ch := make(chan struct{}, 1)
	wake, stop = h.add(stream, waiter{group: group, soon: ch})
	return wake, ch, stop
}

func (h *wakeHub) add(stream string, w waiter) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	h.mu.Lock()
	if h.waiters[stream] == nil {
		h.waiters[stream] = map[chan struct{}]waiter{}
	}
	h.waiters[stream][ch] = w
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		delete(h.waiters[stream], ch)
		if len(h.waiters[stream]) == 0 {
			delete(h.waiters, stream)
		}
		h.mu.Unlock()
	}
}

// count returns how many subscriptions of this process wait on stream.
func (h *wakeHub) count(stream string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.waiters[stream])
}

// notify signals the waiters of stream, or of every stream when stream is
// empty (after the listener reconnects).
func (h *wakeHub) notify(stream string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if stream == "" {
		for _, set := range h.waiters {
			signal(set, nil)
		}
		return
	}
	signal(h.waiters[stream], nil)
}

// notifySoon signals the waiters of stream that its events may become
// claimable soon: an enqueue of this process whose transaction has not
// committed yet.
func (h *wakeHub) notifySoon(stream string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch, w := range h.waiters[stream] {
		if w.soon != nil {
			ch = w.soon
		}
		poke(ch)
	}
}

// notifyGroup signals the waiters of one consumer group of stream (and
// those of any group): events that became claimable for that group only
// (the next events of ordering keys whose heads it settled).
func (h *wakeHub) notifyGroup(stream, group string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	signal(h.waiters[stream], &group)
}

// signal wakes the channels of set (when group is not nil, those of that
// group or of any) without blocking: a channel already signalled stays so.
func signal(set map[chan struct{}]waiter, group *string) {
	for ch, w := range set {
		if group != nil && !w.any && w.group != *group {
			continue
		}
		poke(ch)
	}
}

// poke signals ch without blocking: a channel already signalled stays so.
func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// notifyGate spaces out the NOTIFYs a Store sends per stream. A NOTIFY is
// outstanding from its enqueue until the Store's listener sees a
// notification for its stream (seen), that is until its transaction has
// committed. On a quiet stream, where the last NOTIFY is no longer
// outstanding and at most one enqueue since went without one, the next
// enqueue notifies once the last NOTIFY is every old: so a producer that
// commits one event at a time notifies for each. On a busy stream (more
// enqueues, or the last NOTIFY outstanding) NOTIFYs go every stale: its
// subscribers are polling quickly after the last one anyway, and
// PostgreSQL serialises the commits of notifying transactions. A store
// that does not listen sees nothing and notifies every stale.
type notifyGate struct {
	every time.Duration // the least time between two NOTIFYs of a quiet stream; negative: never notify
	stale time.Duration // the time between two NOTIFYs of a busy stream
	now   func() time.Time
	mu    sync.Mutex
	last  map[string]sentNotify // stream -> its last NOTIFY
}

type sentNotify struct {
	at          time.Time
	outstanding bool // not seen yet
	held        int  // enqueues since that sent none
}

// notifyStale is the time between two NOTIFYs of a busy stream, and the
// longest an outstanding NOTIFY holds the next one back (its transaction
// may run long or roll back, and subscribers of other processes then find
// the stream's newer events by polling only).
const notifyStale = 10 * time.Millisecond

// notifyBusy is how many enqueues without a NOTIFY since the last one make
// a stream busy.
const notifyBusy = 2

func newNotifyGate(every time.Duration) *notifyGate {
	return &notifyGate{every: every, stale: max(every, notifyStale), now: time.Now, last: map[string]sentNotify{}}
}

// due reports whether a NOTIFY for stream should be sent now, and if so
// records it as outstanding. heard reports whether the stream's previous
// NOTIFY came back to the listener: when it did not (the first of the
// stream, or one that went stale), this one may not either, and the
// enqueue wakes the subscribers of this process as well.
func (g *notifyGate) due(stream string) (send, heard bool) {
	if g.every < 0 {
		return false, false
	}
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	last, ok := g.last[stream]
	if ok {
		age := now.Sub(last.at)
		quiet := !last.outstanding && last.held < notifyBusy
		if age < g.every || !quiet && age < g.stale {
			last.held++
			g.last[stream] = last
			return false, false
		}
	}
	if len(g.last) > 10_000 {
		clear(g.last) // bound memory for processes that publish to many streams
	}
	g.last[stream] = sentNotify{at: now, outstanding: true}
	return true, ok && !last.outstanding
}

// seen records that a notification for stream arrived: the outstanding
// NOTIFY has committed (or another process's did, which wakes the same
// subscribers).
func (g *notifyGate) seen(stream string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if last, ok := g.last[stream]; ok {
		last.outstanding = false
		g.last[stream] = last
	}
}

// forget drops the record of stream's last NOTIFY, so the next enqueue
// sends one at once: for a notification that was recorded but never
// queued.
func (g *notifyGate) forget(stream string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.last, stream)
}
