package claimbound

import (
	"testing"
	"time"
)

// TestBound: full claims set and raise the bound, a short claim drops it,
// a drop while a claim runs wins over the claim's result, and the bound is
// dropped MaxAge (DefaultMaxAge for the zero value) after a claim from the
// oldest set it and when a failed event's retry comes due.
func TestBound(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var b Bound
	expect := func(now time.Time, want int64) uint64 {
		t.Helper()
		after, gen := b.Next(now)
		if after != want {
			t.Fatalf("bound %d, want %d", after, want)
		}
		return gen
	}
	gen := expect(t0, 0)
	b.Claimed(t0, 0, gen, 10, 10, 110)
	gen = expect(t0.Add(time.Millisecond), 110)
	b.Claimed(t0.Add(time.Millisecond), 110, gen, 10, 10, 130)
	gen = expect(t0.Add(2*time.Millisecond), 130)
	// A short claim above the bound drops it.
	b.Claimed(t0.Add(2*time.Millisecond), 130, gen, 3, 10, 140)
	gen = expect(t0.Add(3*time.Millisecond), 0)

	// A drop while a claim from the oldest runs: the claim sets nothing.
	b.Drop()
	b.Claimed(t0.Add(3*time.Millisecond), 0, gen, 10, 10, 200)
	gen = expect(t0.Add(4*time.Millisecond), 0)

	// Age: the bound set at t1 lives until t1 + DefaultMaxAge, raised or not.
	t1 := t0.Add(time.Second)
	b.Claimed(t1, 0, gen, 10, 10, 300)
	gen = expect(t1.Add(DefaultMaxAge/2), 300)
	b.Claimed(t1.Add(DefaultMaxAge/2), 300, gen, 10, 10, 320)
	expect(t1.Add(DefaultMaxAge-time.Microsecond), 320)
	gen = expect(t1.Add(DefaultMaxAge), 0)

	// A retry due at t3 drops the bound at the first claim from t3 on.
	t2 := t1.Add(time.Second)
	b.Claimed(t2, 0, gen, 10, 10, 400)
	t3 := t2.Add(DefaultMaxAge / 2)
	b.RetryAt(t3)
	expect(t3.Add(-time.Microsecond), 400)
	gen = expect(t3, 0)
	b.Claimed(t3, 0, gen, 10, 10, 410)
	expect(t3.Add(time.Millisecond), 410) // the retry is forgotten once due

	// Past maxRetries remembered retries, a failure drops the bound.
	for i := range maxRetries {
		b.RetryAt(t3.Add(time.Hour + time.Duration(i)))
	}
	gen = expect(t3.Add(2*time.Millisecond), 410)
	b.RetryAt(t3.Add(time.Hour))
	expect(t3.Add(3*time.Millisecond), 0)
	_ = gen
}

// TestBoundMaxAge: a bound with its own MaxAge lives that long.
func TestBoundMaxAge(t *testing.T) {
	t0 := time.Unix(1000, 0)
	b := Bound{MaxAge: time.Hour}
	_, gen := b.Next(t0)
	b.Claimed(t0, 0, gen, 10, 10, 50)
	if after, _ := b.Next(t0.Add(59 * time.Minute)); after != 50 {
		t.Fatalf("bound %d after 59 minutes of a one-hour MaxAge, want 50", after)
	}
	if after, _ := b.Next(t0.Add(time.Hour)); after != 0 {
		t.Fatalf("bound %d after its one-hour MaxAge, want 0", after)
	}
}
