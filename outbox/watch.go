package outbox

// Watch is for consumers that claim with Claim directly instead of through
// a Subscriber (package relay does): it returns a channel signalled when
// stream may have new due events (a PostgreSQL notification, or an Enqueue
// of this Store whose notification may not reach it), and a function that stops the
// signals. A signal is only a hint: a consumer must still poll, since
// notifications can be lost (a listener reconnecting) and other databases
// send none (see ListenerStatus). Watch also notes (stream, group) as
// consumed, so the backlog gauges report it as zeros while it has no
// undelivered events, as they do for a Subscriber's.
func (s *Store) Watch(stream, group string) (wake <-chan struct{}, stop func()) {
	s.noteGroup(stream, group)
	return s.wake.subscribe(stream)
}
