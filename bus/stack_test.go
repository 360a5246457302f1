package bus_test

import (
	"context"
	"sync"
	"testing"
	"unsafe"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millpond/millpond/bus"
	"github.com/millpond/millpond/handlers"
	"github.com/millpond/millpond/internal/testdb"
)

// useStack needs a frame of 6 KiB: more than a new goroutine's first stack
// holds.
//
//go:noinline
func useStack(i int) byte {
	var frame [6 << 10]byte
	frame[i] = 1
	return frame[len(frame)-1-i]
}

// stackProbe is a Handler that is not a typed handler (which grows its own
// stack): it records whether its goroutine's stack was copied (grown) while
// it used 6 KiB, which moves a local variable.
type stackProbe struct {
	mu    sync.Mutex
	moved []bool
}

func (p *stackProbe) Name() string            { return "stack-probe" }
func (p *stackProbe) Stream() string          { return "orders" }
func (p *stackProbe) Kind() string            { return "OrderPlaced" }
func (p *stackProbe) Policy() handlers.Policy { return handlers.Policy{} }

//go:noinline
func (p *stackProbe) Handle(*message.Message) error {
	var x byte
	before := uintptr(unsafe.Pointer(&x))
	useStack(0)
	moved := uintptr(unsafe.Pointer(&x)) != before
	p.mu.Lock()
	p.moved = append(p.moved, moved)
	p.mu.Unlock()
	return nil
}

func (p *stackProbe) results() []bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]bool(nil), p.moved...)
}

// The bus grows a message's goroutine stack before its middleware, once,
// where the fewest frames are on it: a handler then uses 6 KiB of stack
// without growing it again.
func TestBusGrowsTheStackBeforeTheHandler(t *testing.T) {
	db := testdb.New(t, "sqlite")
	store := db.Store(t)
	probe := &stackProbe{}
	b, err := bus.New(store, bus.Config{Subscriber: fastSubscriber}, probe)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.RegisterGroups(context.Background()); err != nil {
		t.Fatal(err)
	}
	publish(t, db, store, "orders", "OrderPlaced", order(1), order(2), order(3))
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop(context.Background()) })
	waitFor(t, "three handlings", func() bool { return len(probe.results()) == 3 })
	for i, moved := range probe.results() {
		if moved {
			t.Fatalf("handling %d: the stack grew inside the handler, after the bus's middleware", i+1)
		}
	}
}
