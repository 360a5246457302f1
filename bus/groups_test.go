package bus_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millpond/millpond/bus"
	"github.com/millpond/millpond/handlers"
	"github.com/millpond/millpond/internal/testdb"
)

// errorLog records the errors a Watermill logger receives.
type errorLog struct {
	watermill.NopLogger
	mu      sync.Mutex
	entries []logEntry
}

type logEntry struct {
	msg    string
	err    error
	fields watermill.LogFields
}

func (l *errorLog) Error(msg string, err error, fields watermill.LogFields) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.entries = append(l.entries, logEntry{msg, err, fields})
}

func (l *errorLog) With(watermill.LogFields) watermill.LoggerAdapter { return l }

// unserved returns "stream/group" of every ErrUnservedGroup entry.
func (l *errorLog) unserved() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, e := range l.entries {
		if errors.Is(e.err, bus.ErrUnservedGroup) {
			out = append(out, e.fields["stream"].(string)+"/"+e.fields["consumer_group"].(string)+" kinds="+e.fields["event_kinds"].(string))
		}
	}
	return out
}

// Start warns about groups registered for its streams that no handler of
// the bus serves (a renamed handler's old group), and about no other group.
func TestStartWarnsAboutUnservedGroups(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, dialect)
			store := db.Store(t)
			ctx := context.Background()
			fn := func(context.Context, orderPlaced, handlers.Meta) error { return nil }
			// The handler was called "reserve" before; "audit" is another
			// service's group; "ledger" belongs to a stream this bus does not read.
			for _, r := range []struct{ stream, group, kind string }{
				{"orders", "reserve", "OrderPlaced"}, {"orders", "audit", ""}, {"payments", "ledger", "PaymentTaken"},
			} {
				var kinds []string
				if r.kind != "" {
					kinds = append(kinds, r.kind)
				}
				if err := store.RegisterGroup(ctx, r.stream, r.group, kinds...); err != nil {
					t.Fatal(err)
				}
			}
			log := &errorLog{}
			startBus(t, store, bus.Config{Subscriber: fastSubscriber, Logger: log},
				handlers.New("reserve-stock", "orders", "OrderPlaced", fn))
			got := log.unserved()
			want := []string{"orders/audit kinds=*", "orders/reserve kinds=OrderPlaced"}
			if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
				t.Fatalf("unserved-group warnings %q, want %q", got, want)
			}

			// Groups another process serves can be named; a served group is silent.
			log2 := &errorLog{}
			startBus(t, store, bus.Config{Subscriber: fastSubscriber, Logger: log2, OtherGroups: []string{"audit"}},
				handlers.New("reserve-stock", "orders", "OrderPlaced", fn), handlers.New("reserve", "orders", "OrderPlaced", fn))
			if got := log2.unserved(); len(got) != 0 {
				t.Fatalf("warnings with every group served or named: %q", got)
			}
		})
	}
}
