package outbox

import (
	"testing"
	"time"
)

func TestNotifyGateSpacesNotificationsAndForgetsUnsentOnes(t *testing.T) {
	g := newNotifyGate(time.Hour)
	if !g.due("s") {
		t.Fatal("first enqueue of a stream should notify")
	}
	if g.due("s") {
		t.Fatal("second enqueue within the interval should not notify")
	}
	if !g.due("other") {
		t.Fatal("streams are gated separately")
	}
	// The enqueue that was to carry the notification failed: the next one
	// must send it instead of waiting out the interval.
	g.forget("s")
	if !g.due("s") {
		t.Fatal("after forget, the next enqueue should notify")
	}
	if never := newNotifyGate(-1); never.due("s") {
		t.Fatal("a negative interval never notifies")
	}
}
