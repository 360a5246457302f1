package handlers

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
)

// BenchmarkTypedHandleInNewGoroutine measures one handling of a ~200-byte
// JSON event as Watermill's router runs it: in a goroutine of its own.
func BenchmarkTypedHandleInNewGoroutine(b *testing.B) {
	type event struct {
		ID  int64  `json:"id"`
		Pad string `json:"pad"`
	}
	payload := []byte(`{"id":12345,"pad":"` + string(make([]byte, 0, 180)) + `"}`)
	for len(payload) < 200 {
		payload = append(payload[:len(payload)-2], 'x', '"', '}')
	}
	h := New("h", "s", "K", func(ctx context.Context, ev event, _ Meta) error { return nil })
	msg := message.NewMessage("key", payload)
	b.ReportAllocs()
	for b.Loop() {
		done := make(chan error)
		go func() { done <- h.Handle(msg) }()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
}
