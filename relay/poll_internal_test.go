package relay

import (
	"testing"
	"time"
)

// TestEmptyClaimWait: after an empty claim the lead waits twice as long as
// before (from 1 ms, up to the poll interval), but at least three times as
// long as the claim took, up to maxEmptyClaimWait.
func TestEmptyClaimWait(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct {
		prev, took, poll, want time.Duration
	}{
		{0, 0, 50 * ms, ms},                             // first empty claim, cheap
		{ms, 100 * time.Microsecond, 50 * ms, 2 * ms},   // doubling
		{32 * ms, ms, 50 * ms, 50 * ms},                 // capped by the poll interval
		{ms, 20 * ms, 5 * ms, 60 * ms},                  // a slow claim: 3x its duration, past the poll interval
		{60 * ms, 20 * ms, 5 * ms, 60 * ms},             // and no doubling past it
		{ms, 2 * time.Second, time.Second, time.Second}, // at most maxEmptyClaimWait
	} {
		if got := emptyClaimWait(c.prev, c.took, c.poll); got != c.want {
			t.Errorf("emptyClaimWait(%s, %s, %s) = %s, want %s", c.prev, c.took, c.poll, got, c.want)
		}
	}
}
