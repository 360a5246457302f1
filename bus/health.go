package bus

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"time"
)

// Health is a Bus's readiness report, as Health returns it and
// ReadinessHandler serves it as JSON. It holds no addresses, error texts,
// keys or payloads: only states and counts.
type Health struct {
	// Ready is true when the database answers, the router runs and every
	// handler's subscriber runs with claims that do not keep failing (and
	// the checks that HealthOptions turns on pass).
	Ready bool `json:"ready"`
	// Database is "ok" when Store.Ping succeeded, else "unreachable".
	Database string `json:"database"`
	// Listener is the PostgreSQL notification listener: "connected",
	// "disconnected" (subscribers fall back to polling) or "off" (not
	// PostgreSQL, or the store was opened WithoutListen).
	Listener string `json:"listener"`
	// Router is "running", "starting" (Start not called or not done yet)
	// or "stopped".
	Router string `json:"router"`
	// Subscribers counts the bus's subscribers (one per handler, and one
	// per stream for unrouted events unless the policy is UnroutedKeep).
	Subscribers int `json:"subscribers"`
	// SubscribersRunning counts those of Subscribers running now.
	SubscribersRunning int `json:"subscribers_running"`
	// SubscribersFailing counts the subscribers whose claims have kept
	// failing for at least HealthOptions.ClaimFailureGrace (see
	// outbox.Subscriber.FailingSince): they deliver nothing even though
	// the database may answer.
	SubscribersFailing int `json:"subscribers_failing"`
	// OldestPendingAgeSeconds is the age of the oldest pending, blocked or
	// processing event of the bus's consumer groups, from the store's
	// cached Stats snapshot (see outbox.Store.CachedStats).
	OldestPendingAgeSeconds float64 `json:"oldest_pending_age_seconds"`
	// StatsAt is when that snapshot was read, absent when it could not be.
	StatsAt *time.Time `json:"stats_at,omitempty"`
	// Problems names each failed check, in words fit for an operator.
	Problems []string `json:"problems,omitempty"`
}

// HealthOptions configures Health and ReadinessHandler.
type HealthOptions struct {
	// PingTimeout bounds the database ping, and the Stats query when the
	// cached snapshot is stale (default 2 s each).
	PingTimeout time.Duration
	// RequireListener makes a disconnected PostgreSQL listener a reason
	// to be not ready. By default it is only reported: subscribers keep
	// polling without it, only less promptly.
	RequireListener bool
	// MaxOldestPendingAge, when positive, makes an older oldest pending
	// event a reason to be not ready. By default the age is only
	// reported: taking a lagging instance out of service rarely helps
	// it catch up; alert on millpond.backlog.oldest_age instead.
	MaxOldestPendingAge time.Duration
	// ClaimFailureGrace is how long a subscriber's claims may keep failing
	// before the bus is not ready (default 15 s: longer than a database
	// restart usually takes, during which the ping fails anyway). A
	// negative value only reports the failing subscribers.
	ClaimFailureGrace time.Duration
}

// DefaultClaimFailureGrace is HealthOptions.ClaimFailureGrace's default.
const DefaultClaimFailureGrace = 15 * time.Second

// Health checks the bus: the database (one ping), the PostgreSQL listener,
// the router and every subscriber (running, and claiming without lasting
// failures), and reads the oldest pending age from
// the store's cached Stats snapshot (no query when the snapshot is fresh).
func (b *Bus) Health(ctx context.Context, opts HealthOptions) Health {
	h := Health{Ready: true, Database: "ok", Listener: "off", Router: "starting"}
	fail := func(problem string) {
		h.Ready = false
		h.Problems = append(h.Problems, problem)
	}
	timeout := opts.PingTimeout
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	err := b.store.Ping(pctx)
	cancel()
	if err != nil {
		h.Database = "unreachable"
		fail("the database does not answer")
	}
	if listening, connected := b.store.ListenerStatus(); listening {
		h.Listener = "connected"
		if !connected {
			h.Listener = "disconnected"
			if opts.RequireListener {
				fail("the PostgreSQL notification listener is not connected")
			}
		}
	}
	b.mu.Lock()
	started, done := b.started, b.done
	b.mu.Unlock()
	switch {
	case started && isClosed(done), b.router.IsClosed():
		h.Router = "stopped"
		fail("the bus is stopped")
	case started && b.router.IsRunning():
		h.Router = "running"
	default:
		fail("the bus has not started")
	}
	h.Subscribers = len(b.routed)
	// Watermill sets a handler's Stopped channel just after it closes its
	// Started one, and closes the router's Running channel once every
	// handler has both: only then may Stopped be read (a Health racing
	// with Start would read the field while the router writes it).
	if b.router.IsRunning() {
		for _, r := range b.routed {
			if isClosed(r.Started()) && !isClosed(r.Stopped()) {
				h.SubscribersRunning++
			}
		}
	}
	if h.SubscribersRunning < h.Subscribers && h.Router == "running" {
		fail("not every handler's subscriber is running")
	}
	grace := opts.ClaimFailureGrace
	if grace == 0 {
		grace = DefaultClaimFailureGrace
	}
	for _, sub := range b.subs {
		if since, failing := sub.FailingSince(); failing && time.Since(since) >= max(grace, 0) {
			h.SubscribersFailing++
		}
	}
	if h.SubscribersFailing > 0 && grace > 0 {
		fail("the claims of a subscriber keep failing")
	}
	sctx, cancel := context.WithTimeout(ctx, timeout)
	stats, at, err := b.store.CachedStats(sctx)
	cancel()
	if err == nil {
		at = at.UTC()
		h.StatsAt = &at
		served := map[[2]string]bool{}
		for _, hd := range b.handlers {
			served[[2]string{hd.Stream(), hd.Name()}] = true
		}
		for _, st := range stats {
			ours := served[[2]string{st.Stream, st.Group}] || st.Group == "" && b.cfg.Unrouted != UnroutedKeep && slices.Contains(b.streams, st.Stream)
			if ours {
				h.OldestPendingAgeSeconds = max(h.OldestPendingAgeSeconds, st.OldestPendingAge.Seconds())
			}
		}
		if opts.MaxOldestPendingAge > 0 && h.OldestPendingAgeSeconds > opts.MaxOldestPendingAge.Seconds() {
			fail("the oldest pending event is older than the allowed age")
		}
	}
	return h
}

func isClosed(ch <-chan struct{}) bool {
	if ch == nil {
		return false
	}
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// ReadinessHandler serves a Bus's Health as JSON, for a /readyz endpoint:
// 200 when ready, 503 when not. Make it with Bus.ReadinessHandler.
type ReadinessHandler struct {
	bus  *Bus
	opts HealthOptions
}

// ReadinessHandler returns an http.Handler that serves the bus's Health
// (GET or HEAD): status 200 when ready, 503 when not, with the report as a
// JSON body (no addresses, error texts or event data in it).
func (b *Bus) ReadinessHandler(opts HealthOptions) *ReadinessHandler {
	return &ReadinessHandler{bus: b, opts: opts}
}

// ServeHTTP writes the health report.
func (h *ReadinessHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	report := h.bus.Health(r.Context(), h.opts)
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
