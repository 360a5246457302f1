package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.uber.org/zap"

	"github.com/millpond/millpond/bus"
	"github.com/millpond/millpond/fxmodule"
	"github.com/millpond/millpond/handlers"
	"github.com/millpond/millpond/internal/panicstack"
	"github.com/millpond/millpond/outbox"
)

// kindFunc handles the deliveries of one event kind within a group.
type kindFunc func(msg *message.Message, meta handlers.Meta) error

// on returns a kindFunc that decodes the JSON payload into T and calls fn;
// a payload that does not decode is a permanent failure (dead-lettered at
// once), as in handlers.New.
func on[T any](fn handlers.Func[T]) kindFunc {
	return func(msg *message.Message, meta handlers.Meta) error {
		var event T
		if err := json.Unmarshal(msg.Payload, &event); err != nil {
			return handlers.Permanent(fmt.Errorf("decode %s payload into %T: %w", meta.Kind, event, err))
		}
		return fn(msg.Context(), event, meta)
	}
}

// group is one consumer group on Stream that takes several event kinds
// and so gets an order's events of those kinds one at a time, in commit
// order (order holds per stream, consumer group and ordering key). A bus
// handler takes one kind only, so such a group is a Watermill handler of
// its own on the bus's router, over an outbox.Subscriber whose Kinds list
// the group's kinds, switching on the event kind (see the package
// documentation).
type group struct {
	name  string
	kinds map[string]kindFunc
}

// Kinds returns the group's kinds, sorted.
func (g group) Kinds() []string {
	out := make([]string, 0, len(g.kinds))
	for k := range g.kinds {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// handle routes a delivery to its kind's function. An unknown kind (written
// while the group still took it) and a panic become errors, as in the bus:
// the first is dead-lettered with the reason, the second retried.
func (g group) handle(msg *message.Message) (err error) {
	meta := handlers.MetaOf(msg)
	fn, ok := g.kinds[meta.Kind]
	if !ok {
		return handlers.Permanent(fmt.Errorf("group %s takes kinds %v, not %q", g.name, g.Kinds(), meta.Kind))
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("group %s: panic: %v\n%s", g.name, r, panicstack.Stack())
		}
	}()
	if err := fn(msg, meta); err != nil {
		return fmt.Errorf("group %s, %s: %w", g.name, meta.Kind, err)
	}
	return nil
}

// groupInFlight is how many events of a group run at once (per process),
// over different orders: one order's events still come one at a time.
const groupInFlight = 8

// subscriberDefaults are the outbox subscriber settings of every handler
// and group.
func subscriberDefaults(cfg config) outbox.SubscriberConfig {
	return outbox.SubscriberConfig{Lease: cfg.Lease, MaxInFlight: 4}
}

// groupNames are the consumer groups the service runs next to the bus's
// handlers; the bus is told they are served (bus.Config.OtherGroups).
var groupNames = []string{"reserve-stock", "read-model"}

// orderGroups are the service's multi-kind consumer groups, running on the
// bus's router.
type orderGroups struct {
	groups []group
	routed []*message.Handler
}

// newOrderGroups adds the groups to the bus's router before the bus starts
// (fx builds every component before the first start hook runs). The
// router subscribes them, which registers each group for its kinds, before
// the bus's Start returns, and so before the HTTP server (which depends on
// the groups) accepts the first order; the router's middleware (the bus's
// failure recording) applies to them, and the bus's Stop stops them.
func newOrderGroups(b *bus.Bus, store *outbox.Store, cfg config, w *workers, log *zap.Logger) (*orderGroups, error) {
	og := &orderGroups{groups: []group{newStockGroup(w), newReadModelGroup(w)}}
	logger := fxmodule.WatermillLogger(log.Named("millpond.bus"))
	for _, g := range og.groups {
		sc := subscriberDefaults(cfg)
		sc.ConsumerGroup, sc.Kinds, sc.MaxInFlight = g.name, g.Kinds(), groupInFlight
		sc.CloseTimeout, sc.Logger = 8*time.Second, logger // as fxmodule's bus subscribers
		sub, err := outbox.NewSubscriber(store, sc)
		if err != nil {
			return nil, fmt.Errorf("orders: group %s: %w", g.name, err)
		}
		og.routed = append(og.routed, b.Router().AddConsumerHandler(g.name, Stream, sub, g.handle))
	}
	return og, nil
}

// readiness serves /readyz: the bus's Health (bus.ReadinessHandler's
// report) with the groups' subscribers and backlogs counted in, which the
// bus does not know of.
type readiness struct {
	bus    *bus.Bus
	store  *outbox.Store
	opts   bus.HealthOptions
	groups *orderGroups
}

// Health returns the bus's report with the groups added.
func (h *readiness) Health(ctx context.Context) bus.Health {
	report := h.bus.Health(ctx, h.opts)
	fail := func(problem string) {
		report.Ready = false
		if !slices.Contains(report.Problems, problem) {
			report.Problems = append(report.Problems, problem)
		}
	}
	report.Subscribers += len(h.groups.routed)
	// A handler's Stopped channel is set after its Started one closes:
	// read it only once the router runs (as bus.Health does).
	if h.bus.Router().IsRunning() {
		for _, r := range h.groups.routed {
			if closed(r.Started()) && !closed(r.Stopped()) {
				report.SubscribersRunning++
			}
		}
	}
	if report.SubscribersRunning < report.Subscribers && report.Router == "running" {
		fail("not every handler's subscriber is running")
	}
	if stats, _, err := h.store.CachedStats(ctx); err == nil {
		for _, st := range stats {
			if st.Stream == Stream && slices.Contains(groupNames, st.Group) {
				report.OldestPendingAgeSeconds = max(report.OldestPendingAgeSeconds, st.OldestPendingAge.Seconds())
			}
		}
		if h.opts.MaxOldestPendingAge > 0 && report.OldestPendingAgeSeconds > h.opts.MaxOldestPendingAge.Seconds() {
			fail("the oldest pending event is older than the allowed age")
		}
	}
	return report
}

// ServeHTTP writes the report as bus.ReadinessHandler does: 200 when
// ready, 503 when not.
func (h *readiness) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	report := h.Health(r.Context())
	status := http.StatusOK
	if !report.Ready {
		status = http.StatusServiceUnavailable
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	if r.Method == http.MethodGet {
		_ = json.NewEncoder(w).Encode(report)
	}
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
