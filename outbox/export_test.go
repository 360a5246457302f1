package outbox

import "time"

// SetNotifyStale sets how long an outstanding NOTIFY of s holds the next
// one back, for tests that must tell a NOTIFY let go by its return from
// one let go by age.
func SetNotifyStale(s *Store, d time.Duration) { s.gate.stale = d }

// NotifyOutstanding reports whether s has sent a NOTIFY for stream that
// its listener has not seen come back.
func NotifyOutstanding(s *Store, stream string) bool {
	s.gate.mu.Lock()
	defer s.gate.mu.Unlock()
	return s.gate.last[stream].outstanding
}
