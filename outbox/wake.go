package outbox

import "sync"

// wakeHub fans PostgreSQL notifications out to the subscribers of this
// process. A notification only hints that a stream may have due events;
// subscribers also poll, so a lost hint delays but never loses an event.
type wakeHub struct {
	listening bool
	mu        sync.Mutex
	waiters   map[string]map[chan struct{}]struct{}
}

func newWakeHub() *wakeHub {
	return &wakeHub{waiters: map[string]map[chan struct{}]struct{}{}}
}

// subscribe returns a channel signalled when stream may have due events,
// and a function that stops the signals.
func (h *wakeHub) subscribe(stream string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	h.mu.Lock()
	if h.waiters[stream] == nil {
		h.waiters[stream] = map[chan struct{}]struct{}{}
	}
	h.waiters[stream][ch] = struct{}{}
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

// notify signals the waiters of stream, or of every stream when stream is
// empty (after the listener reconnects).
func (h *wakeHub) notify(stream string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	signal := func(set map[chan struct{}]struct{}) {
		for ch := range set {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
	if stream == "" {
		for _, set := range h.waiters {
			signal(set)
		}
		return
	}
	signal(h.waiters[stream])
}
