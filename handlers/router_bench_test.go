//go:build unix

package handlers

import (
	"context"
	"encoding/json"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millpond/millpond/internal/gostack"
)

// The two benchmarks below hand b.N messages of a ~200-byte JSON event out
// from 8 goroutines that each wait for the Ack, as an outbox Subscriber
// with MaxInFlight 8 does, without a database: one to 8 goroutines that
// decode the event's id and ack (the bench's bare Subscriber), one to
// Watermill's router running a typed handler as the bus does. Besides
// ns/op (wall, noisy on a shared machine) they report cpu-ns/op, the
// process's CPU time per message.

type benchEvent struct {
	ID  int64  `json:"id"`
	Pad string `json:"pad"`
}

func benchPayload() []byte {
	payload := []byte(`{"id":12345,"pad":"` + string(make([]byte, 0, 180)) + `"}`)
	for len(payload) < 200 {
		payload = append(payload[:len(payload)-2], 'x', '"', '}')
	}
	return payload
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// handingOut is a message.Subscriber that hands n messages out from 8
// goroutines, each waiting for the Ack of its message before the next.
// done is closed when every message was acked, after the channel (so that
// the router's Close need not wait for its timeout).
type handingOut struct {
	n       int
	payload []byte
	done    chan struct{}
}

func (f *handingOut) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	out := make(chan *message.Message)
	next := make(chan struct{}, f.n)
	for range f.n {
		next <- struct{}{}
	}
	close(next)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range next {
				msg := message.NewMessage("key", f.payload)
				msg.Metadata.Set(metadataKind, "K")
				msg.Metadata.Set(metadataAttempt, "1")
				msg.Metadata.Set(metadataEventID, "123")
				out <- msg
				<-msg.Acked()
			}
		})
	}
	go func() { wg.Wait(); close(out); close(f.done) }()
	return out, nil
}

func (f *handingOut) Close() error { return nil }

func BenchmarkHandOutToWorkers(b *testing.B) {
	f := &handingOut{n: b.N, payload: benchPayload(), done: make(chan struct{})}
	b.ReportAllocs()
	cpu := processCPU()
	msgs, _ := f.Subscribe(context.Background(), "t")
	for range 8 {
		go func() {
			for msg := range msgs {
				var v struct {
					ID int64 `json:"id"`
				}
				_ = json.Unmarshal(msg.Payload, &v)
				msg.Ack()
			}
		}()
	}
	<-f.done
	b.ReportMetric(float64(processCPU()-cpu)/float64(b.N), "cpu-ns/op")
}

func BenchmarkHandOutToRouterTypedHandler(b *testing.B) {
	h := New("h", "s", "K", func(ctx context.Context, ev benchEvent, _ Meta) error { return nil })
	f := &handingOut{n: b.N, payload: benchPayload(), done: make(chan struct{})}
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		b.Fatal(err)
	}
	// As the bus's router: a middleware that grows the stack and records
	// failures, a handler that checks the kind.
	r.AddMiddleware(func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			gostack.Grow()
			out, err := next(msg)
			if err != nil {
				msg.Metadata.Set("error", err.Error())
			}
			if IsPermanent(err) {
				msg.Metadata.Set("dead_letter_now", "true")
			}
			return out, err
		}
	})
	r.AddConsumerHandler("h", "t", f, func(msg *message.Message) error {
		if msg.Metadata.Get(metadataKind) != "K" {
			return Permanent(nil)
		}
		return h.Handle(msg)
	})
	b.ReportAllocs()
	cpu := processCPU()
	go func() { _ = r.Run(context.Background()) }()
	<-f.done
	b.ReportMetric(float64(processCPU()-cpu)/float64(b.N), "cpu-ns/op")
	b.StopTimer()
	_ = r.Close()
}
