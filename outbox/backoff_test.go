package outbox

import (
	"testing"
	"time"
)

// TestDefaultBackoffDoublesWithJitter: 1 s doubling per attempt, each delay
// within ±20% of its step, capped at 5 minutes, and not the same every time.
func TestDefaultBackoffDoublesWithJitter(t *testing.T) {
	for attempt := 0; attempt <= 40; attempt++ {
		step := time.Second << min(max(attempt, 1)-1, 20)
		capped := min(step, 5*time.Minute)
		lo, hi := capped*8/10, min(capped*12/10, 5*time.Minute)
		seen := map[time.Duration]bool{}
		for range 50 {
			d := DefaultBackoff(attempt)
			if d < lo || d > hi {
				t.Fatalf("attempt %d: delay %s outside %s-%s", attempt, d, lo, hi)
			}
			seen[d] = true
		}
		if len(seen) < 10 {
			t.Fatalf("attempt %d: %d distinct delays in 50 draws; want jitter", attempt, len(seen))
		}
	}
}

// TestRetryBacksOffAndStops: retry gives up when its budget is spent, stops
// at a stale claim, and waits between tries.
func TestRetryBacksOffAndStops(t *testing.T) {
	tries := 0
	start := time.Now()
	err := retry(nil, 400*time.Millisecond, func() error { tries++; return errTest })
	if err != errTest || tries < 2 || tries > 6 {
		t.Fatalf("retry within 400ms: %d tries, %v; want 2-6 tries and the error", tries, err)
	}
	if time.Since(start) > 2*time.Second {
		t.Fatalf("retry ran %s past a 400ms budget", time.Since(start))
	}
	tries = 0
	if err := retry(nil, time.Minute, func() error { tries++; return ErrStaleClaim }); err != ErrStaleClaim || tries != 1 {
		t.Fatalf("a stale claim is retried: %d tries, %v", tries, err)
	}
	stop := make(chan struct{})
	close(stop)
	tries, start = 0, time.Now()
	if err := retry(stop, time.Minute, func() error { tries++; return errTest }); err != errTest {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 3*time.Second || tries > 12 {
		t.Fatalf("stopping: retried %d times for %s; want about a second, with waits between", tries, d)
	}
}

type testError struct{}

func (testError) Error() string { return "test error" }

var errTest error = testError{}
