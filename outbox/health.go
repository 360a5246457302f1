package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
)

// Ping checks that the store's database answers (a PostgreSQL pool's
// Ping, a database/sql PingContext), for readiness checks.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.ready(ctx); err != nil {
		return err
	}
	var err error
	switch {
	case s.pool != nil:
		err = s.pool.Ping(ctx)
	case s.sqlDB != nil:
		err = s.sqlDB.PingContext(ctx)
	default:
		err = errors.New("no database")
	}
	if err != nil {
		return fmt.Errorf("outbox: ping: %w", err)
	}
	return nil
}

// ListenerStatus tells whether the store listens for PostgreSQL
// notifications (a PostgreSQL store without WithoutListen) and, if so,
// whether its listening connection is connected now. Subscribers still
// poll while it is not, only less promptly.
func (s *Store) ListenerStatus() (listening, connected bool) {
	return s.wake.listening, s.listenerUp.Load()
}

// statsCache holds the latest Stats snapshot for the gauges, readiness and
// CachedStats. Its fill slot is held while the query runs, so callers that
// arrive meanwhile wait for that query rather than start their own, each
// for as long as its own context lasts; its mutex is never held across a
// query (noteGroup, which a Subscribe calls under the Subscriber's lock,
// takes it).
type statsCache struct {
	interval time.Duration // <= 0: no caching

	fillOnce sync.Once
	fill     chan struct{} // capacity 1: held by the caller running Stats

	mu    sync.Mutex // guards the fields below
	at    time.Time
	stats []StreamStats
	err   error
	seen  map[[2]string]bool // every (stream, group) reported so far
}

// CachedStats returns the Stats snapshot that the backlog gauges report and
// when it was read: Stats runs at most once per stats interval (see
// WithStatsInterval), however many callers ask, and a failed read is
// returned (and not retried) until the interval passes too, unless it
// failed because ctx ended: that error goes to this caller only. A caller
// that arrives while another's read is under way waits for it as long as
// ctx lasts, then fails with ctx's error. Each
// caller gets its own copy of the slice, free to sort or change. Use it for
// dashboards and readiness probes; use Stats for a fresh count.
func (s *Store) CachedStats(ctx context.Context) ([]StreamStats, time.Time, error) {
	if err := s.ready(ctx); err != nil {
		return nil, time.Time{}, err
	}
	c := &s.statsCache
	c.fillOnce.Do(func() { c.fill = make(chan struct{}, 1) })
	select {
	case c.fill <- struct{}{}:
	case <-ctx.Done():
		// Another caller's query is under way (a database that does not
		// answer holds it up to that caller's deadline): this caller
		// stops waiting when its own context ends.
		return nil, time.Time{}, fmt.Errorf("outbox: stats: waiting for the query under way: %w", ctx.Err())
	}
	defer func() { <-c.fill }()
	c.mu.Lock()
	if c.interval > 0 && !c.at.IsZero() && time.Since(c.at) < c.interval {
		defer c.mu.Unlock()
		return slices.Clone(c.stats), c.at, c.err
	}
	c.mu.Unlock()
	start := time.Now()
	stats, err := s.Stats(ctx)
	s.tel.statsTime.Record(ctx, time.Since(start).Seconds())
	if err != nil && ctx.Err() != nil {
		// This caller gave up (a probe's timeout, a client gone): not the
		// database's answer, so the snapshot stays and the next caller
		// reads again, rather than every gauge reporting nothing for an
		// interval.
		return nil, time.Time{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.at, c.stats, c.err = time.Now(), stats, err
	return slices.Clone(stats), c.at, err
}

// noteGroup makes the gauges report a (stream, group) even while it has no
// undelivered events (as zeros): called for every subscription.
func (s *Store) noteGroup(stream, group string) {
	c := &s.statsCache
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seen == nil {
		c.seen = map[[2]string]bool{}
	}
	if len(c.seen) < maxAttrSets {
		c.seen[[2]string{stream, group}] = true
	}
}

// statsCollectTimeout bounds the Stats query of a metrics collection whose
// context has no deadline.
const statsCollectTimeout = 5 * time.Second

// observeStats is the callback of every backlog gauge: one cached snapshot
// feeds them all. A (stream, group) reported once, or consumed by a
// Subscriber of this store, is reported as zeros while it has no
// undelivered events, so its series go to 0 rather than vanish.
func (s *Store) observeStats(ctx context.Context, o metric.Observer) error {
	if _, ok := ctx.Deadline(); !ok {
		// The Prometheus exporter collects with a context that never
		// ends: on a database that hangs, the query would hold the
		// collection of every metric of the process, and the stats cache,
		// for as long as the kernel keeps the connection.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, statsCollectTimeout)
		defer cancel()
	}
	stats, _, err := s.CachedStats(ctx)
	if err != nil {
		return err
	}
	t := s.tel
	c := &s.statsCache
	c.mu.Lock()
	if c.seen == nil {
		c.seen = map[[2]string]bool{}
	}
	present := make(map[[2]string]bool, len(stats))
	for _, st := range stats {
		k := [2]string{st.Stream, st.Group}
		present[k] = true
		if len(c.seen) < maxAttrSets {
			c.seen[k] = true
		}
	}
	for k := range c.seen {
		if !present[k] {
			stats = append(stats, StreamStats{Stream: k[0], Group: k[1]})
		}
	}
	c.mu.Unlock()
	for _, st := range stats {
		base := []attribute.KeyValue{systemAttr, semconv.MessagingDestinationName(st.Stream), semconv.MessagingConsumerGroupName(st.Group)}
		attrs := metric.WithAttributeSet(attribute.NewSet(base...))
		state := func(name string) metric.ObserveOption {
			return metric.WithAttributeSet(attribute.NewSet(append(base[:3:3], AttrState.String(name))...))
		}
		o.ObserveInt64(t.backlog, st.Pending-st.Retrying, state("pending"))
		o.ObserveInt64(t.backlog, st.Retrying, state("retrying"))
		o.ObserveInt64(t.backlog, st.Processing, state("processing"))
		o.ObserveInt64(t.backlog, st.Blocked, state("blocked"))
		o.ObserveInt64(t.backlog, st.Dead, state("dead"))
		o.ObserveFloat64(t.oldestAge, st.OldestPendingAge.Seconds(), attrs)
		o.ObserveInt64(t.deadLetters, st.Dead, attrs)
		o.ObserveInt64(t.blocked, st.Blocked, attrs)
		o.ObserveInt64(t.heldKeys, st.HeldKeys, attrs)
	}
	return nil
}
