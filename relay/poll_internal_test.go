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

// TestFullWindowResumesInBursts: on a full window of 16 (refill 2) one
// confirmation does not signal room and two do, which resumes a publisher
// waiting for room; the window never lets more than 16 be unconfirmed; a
// window of 1 resumes at each confirmation. (A publisher that comes to the
// window after the first confirmation finds room at once: the bursts are
// those of a publisher that was waiting.)
func TestFullWindowResumesInBursts(t *testing.T) {
	for _, c := range []struct{ window, refill int }{{16, 2}, {1, 1}, {1000, 64}} {
		if got := windowRefill(c.window); got != int64(c.refill) {
			t.Errorf("windowRefill(%d) = %d, want %d", c.window, got, c.refill)
		}
	}
	p := &pipeline{r: &runner{cfg: Config{Window: 16}}, stop: make(chan struct{}), room: make(chan struct{}, 1), refill: windowRefill(16)}
	for range 16 {
		if !p.waitRoom() {
			t.Fatal("waitRoom false before stop")
		}
		p.unconfirmed.Add(1)
	}
	resumed := make(chan bool, 1)
	go func() { resumed <- p.waitRoom() }()
	p.leaveWindow()
	if len(p.room) != 0 {
		t.Fatal("one confirmation of a full window of 16 signalled room")
	}
	p.leaveWindow()
	select {
	case ok := <-resumed:
		if !ok {
			t.Fatal("waitRoom false before stop")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the publisher did not resume after two confirmations")
	}
	if n := p.unconfirmed.Load(); n != 14 {
		t.Fatalf("%d unconfirmed, want 14", n)
	}
	// Refilled, the window takes two more without waiting, then is full.
	for range 2 {
		if !p.waitRoom() {
			t.Fatal("waitRoom false before stop")
		}
		p.unconfirmed.Add(1)
	}
	go func() { resumed <- p.waitRoom() }()
	close(p.stop)
	select {
	case ok := <-resumed:
		if ok {
			t.Fatal("waitRoom true on a full window after stop")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waitRoom did not return after stop")
	}

	p = &pipeline{r: &runner{cfg: Config{Window: 1}}, stop: make(chan struct{}), room: make(chan struct{}, 1), refill: windowRefill(1)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 3 {
			if !p.waitRoom() {
				t.Error("waitRoom false before stop")
				return
			}
			p.unconfirmed.Add(1)
			p.leaveWindow()
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		close(p.stop)
		t.Fatal("a window of 1 did not take a publish after each confirmation")
	}
}

// TestClaimersByBatchAndWindow: a batch as large as the window is claimed
// by one claimer; smaller batches by two while claims come back full.
func TestClaimersByBatchAndWindow(t *testing.T) {
	for _, c := range []struct{ batch, window, want int }{
		{1000, 1000, 1}, {1000, 256, 1}, {256, 256, 1}, {100, 256, 2}, {1, 2, 2},
	} {
		if got := claimers(Config{BatchSize: c.batch, Window: c.window}); got != c.want {
			t.Errorf("claimers(BatchSize %d, Window %d) = %d, want %d", c.batch, c.window, got, c.want)
		}
	}
}
