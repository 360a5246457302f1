package relay

import "time"

// SetMaxBoundAge sets the claim bound's longest life for a test and
// returns a function that restores it.
func SetMaxBoundAge(d time.Duration) (restore func()) {
	prev := maxBoundAge
	maxBoundAge = d
	return func() { maxBoundAge = prev }
}
