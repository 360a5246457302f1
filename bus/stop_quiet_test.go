package bus_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millpond/millpond/bus"
	"github.com/millpond/millpond/handlers"
	"github.com/millpond/millpond/internal/testdb"
)

// stopLog is a Watermill logger that records the calls it gets after the
// bus's Stop returned. Once Stop has begun, the calls of a router handler's
// logger (the one with a subscriber_name field) are slowed down, so that a
// handler goroutine still logging when Stop returns is caught.
type stopLog struct {
	*stopState
	handler bool
}

type stopState struct {
	stopping, stopped atomic.Bool
	mu                sync.Mutex
	late              []string
}

func (l stopLog) log(msg string) {
	if l.handler && l.stopping.Load() {
		time.Sleep(100 * time.Millisecond)
	}
	if l.stopped.Load() {
		l.mu.Lock()
		l.late = append(l.late, msg)
		l.mu.Unlock()
	}
}

func (l stopLog) Error(msg string, _ error, _ watermill.LogFields) { l.log(msg) }
func (l stopLog) Info(msg string, _ watermill.LogFields)           { l.log(msg) }
func (l stopLog) Debug(msg string, _ watermill.LogFields)          { l.log(msg) }
func (l stopLog) Trace(msg string, _ watermill.LogFields)          { l.log(msg) }

func (l stopLog) With(fields watermill.LogFields) watermill.LoggerAdapter {
	_, handler := fields["subscriber_name"]
	return stopLog{l.stopState, l.handler || handler}
}

// TestStopReturnsWhenTheBusNoLongerLogs: once Stop returns, the bus calls
// its logger no more. Watermill's router returns from Run while its
// handlers' goroutines still log their last lines; Stop used to return
// then, racing with a caller that closes, flushes or reads the logger.
func TestStopReturnsWhenTheBusNoLongerLogs(t *testing.T) {
	db := testdb.New(t, "sqlite")
	store := db.Store(t)
	logs := stopLog{stopState: &stopState{}}
	h := handlers.New("reserve-stock", "orders", "OrderPlaced", func(context.Context, orderPlaced, handlers.Meta) error { return nil })
	b, err := bus.New(store, bus.Config{Logger: logs, Subscriber: fastSubscriber}, h)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	logs.stopping.Store(true)
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	logs.stopped.Store(true)
	time.Sleep(300 * time.Millisecond)
	logs.mu.Lock()
	defer logs.mu.Unlock()
	if len(logs.late) > 0 {
		t.Fatalf("the bus logged after Stop returned: %q", logs.late)
	}
}
