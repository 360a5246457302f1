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

// Start registers each handler's consumer group once, through
// RegisterGroups, and not again when the router subscribes the handler's
// subscriber: each registration is a write transaction (on SQLite, a turn
// of the single writer). A trigger counts the registration INSERTs, which
// fire it even when the row is already there (ON CONFLICT DO NOTHING).
func TestStartRegistersEachGroupOnce(t *testing.T) {
	db := testdb.New(t, "sqlite")
	store := db.Store(t)
	ctx := context.Background()
	for _, stmt := range []string{
		`CREATE TABLE test_registrations (consumer_group TEXT NOT NULL)`,
		`CREATE TRIGGER test_count_registrations BEFORE INSERT ON millpond_subscriptions
BEGIN INSERT INTO test_registrations VALUES (NEW.consumer_group); END`,
	} {
		if _, err := db.SQL.ExecContext(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	fn := func(context.Context, orderPlaced, handlers.Meta) error { return nil }
	b := startBus(t, store, bus.Config{Subscriber: fastSubscriber},
		handlers.New("reserve-stock", "orders", "OrderPlaced", fn),
		handlers.New("notify", "orders", "OrderShipped", fn))
	// The router has subscribed every handler's subscriber by the time
	// Start returns; stopping waits for them all.
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := db.SQL.QueryContext(ctx, `SELECT consumer_group, COUNT(*) FROM test_registrations GROUP BY consumer_group ORDER BY consumer_group`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[string]int{}
	for rows.Next() {
		var g string
		var n int
		if err := rows.Scan(&g, &n); err != nil {
			t.Fatal(err)
		}
		got[g] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["reserve-stock"] != 1 || got["notify"] != 1 {
		t.Fatalf("registration INSERTs by consumer group: %v, want one for reserve-stock and one for notify", got)
	}
	regs, err := store.RegisteredGroups(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	if len(regs) != 2 {
		t.Fatalf("registered groups of orders: %+v, want reserve-stock and notify", regs)
	}
}
