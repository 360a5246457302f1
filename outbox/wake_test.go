package outbox

import (
	"testing"
	"time"
)

func TestNotifyGateSpacesNotificationsAndForgetsUnsentOnes(t *testing.T) {
	clock := time.Unix(0, 0)
	g := newNotifyGate(3 * time.Millisecond)
	g.now = func() time.Time { return clock }
	step := func(d time.Duration) { clock = clock.Add(d) }
	due := func(stream string) bool { send, _ := g.due(stream); return send }
	if send, heard := g.due("s"); !send || heard {
		t.Fatalf("first enqueue of a stream: send %v, heard %v; want a NOTIFY, not known to come back", send, heard)
	}
	g.seen("s")
	if due("s") {
		t.Fatal("an enqueue within the spacing should not notify, even after the last NOTIFY was seen")
	}
	if !due("other") {
		t.Fatal("streams are gated separately")
	}
	step(3 * time.Millisecond)
	if send, heard := g.due("s"); !send || !heard {
		t.Fatalf("an enqueue after the spacing, its last NOTIFY seen: send %v, heard %v; want both", send, heard)
	}
	// Not seen yet: its transaction has not committed.
	step(5 * time.Millisecond)
	if due("s") {
		t.Fatal("an enqueue while the last NOTIFY is outstanding should not notify")
	}
	step(5 * time.Millisecond)
	if send, heard := g.due("s"); !send || heard {
		t.Fatalf("an outstanding NOTIFY older than 10 ms: send %v, heard %v; want a NOTIFY, not known to come back", send, heard)
	}
	// A busy stream: two enqueues went without a NOTIFY since the last,
	// seen, one; the next NOTIFY goes 10 ms after it, not 3.
	g.seen("s")
	step(time.Millisecond)
	due("s")
	step(time.Millisecond)
	due("s")
	step(2 * time.Millisecond)
	if due("s") {
		t.Fatal("a busy stream notified 4 ms after its last NOTIFY")
	}
	step(6 * time.Millisecond)
	if !due("s") {
		t.Fatal("a busy stream did not notify 10 ms after its last NOTIFY")
	}
	// One enqueue without a NOTIFY leaves a stream quiet.
	g.seen("s")
	step(time.Millisecond)
	due("s")
	step(2 * time.Millisecond)
	if !due("s") {
		t.Fatal("a stream with one enqueue since its last, seen, NOTIFY did not notify 3 ms after it")
	}
	// The enqueue that was to carry the notification failed: the next one
	// must send it instead of waiting.
	g.forget("s")
	if !due("s") {
		t.Fatal("after forget, the next enqueue should notify")
	}
	if never := newNotifyGate(-1); func() bool { send, _ := never.due("s"); return send }() {
		t.Fatal("a negative interval never notifies")
	}
	if long := newNotifyGate(time.Second); long.stale != time.Second {
		t.Fatalf("an outstanding NOTIFY holds the next back for %s under a 1 s spacing, want 1 s", long.stale)
	}
}

func TestWakeHubSignalsTheSettlingGroupOnly(t *testing.T) {
	h := newWakeHub()
	a, aSoon, stopA := h.subscribeGroup("s", "a")
	defer stopA()
	b, _, stopB := h.subscribeGroup("s", "b")
	defer stopB()
	anyGroup, stopAny := h.subscribe("s")
	defer stopAny()
	other, _, stopOther := h.subscribeGroup("t", "a")
	defer stopOther()
	signalled := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	h.notifyGroup("s", "a")
	if !signalled(a) || signalled(b) || !signalled(anyGroup) || signalled(other) {
		t.Fatal("notifyGroup(s, a) must wake group a of s and the any-group waiter of s only")
	}
	h.notify("s")
	if !signalled(a) || !signalled(b) || !signalled(anyGroup) || signalled(other) {
		t.Fatal("notify(s) must wake every waiter of s")
	}
	h.notify("")
	if !signalled(a) || !signalled(b) || !signalled(anyGroup) || !signalled(other) {
		t.Fatal("notify of every stream must wake every waiter")
	}
	// An enqueue not committed yet signals a group's second channel, and
	// the any-group waiter's only channel.
	h.notifySoon("s")
	if !signalled(aSoon) || signalled(a) || signalled(b) || !signalled(anyGroup) || signalled(other) {
		t.Fatal("notifySoon(s) must signal the soon channels of the groups of s and the any-group waiter of s only")
	}
	if h.count("s") != 3 {
		t.Fatalf("count(s) = %d, want 3", h.count("s"))
	}
}
