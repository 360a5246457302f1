package relay

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/metric"

	"github.com/millpond/millpond/internal/claimbound"
	"github.com/millpond/millpond/outbox"
)

// DefaultGroup is the consumer group a relay consumes when
// Config.Group is empty.
const DefaultGroup = "relay"

// Defaults of Config.
const (
	// DefaultWindow is Config.Window's default for a Watermill relay (a
	// JetStream relay's is DefaultJetStreamWindow).
	DefaultWindow = 256
	// DefaultBatchSize is Config.BatchSize's default.
	DefaultBatchSize = outbox.MaxBatch
	// DefaultLease is Config.Lease's default.
	DefaultLease = 30 * time.Second
	// DefaultMaxBackoff is Config.MaxBackoff's default.
	DefaultMaxBackoff = 10 * time.Second
	// DefaultPublishTimeout is Config.PublishTimeout's default.
	DefaultPublishTimeout = 10 * time.Second
	// DefaultCloseTimeout is Config.CloseTimeout's default.
	DefaultCloseTimeout = 10 * time.Second
)

// Config is what both relays share. Zero values take the defaults.
type Config struct {
	// Streams are the outbox streams to relay (at least one).
	Streams []string
	// Group is the relay's consumer group (default DefaultGroup). It is
	// registered for every stream when the relay starts; events enqueued
	// before the group was registered are not relayed, so register it
	// (Store.RegisterGroup) before producers start, for example at deploy.
	Group string
	// Kinds limits the relay to these event kinds; empty relays every kind.
	Kinds []string
	// Window is the most events of one outbox stream published and not
	// yet confirmed at once, across keys, 1-outbox.MaxBatch (default 256;
	// the JetStream relay's is DefaultJetStreamWindow, 1000).
	// A full window takes new publishes again once Window/8 of its
	// publishes (at least 1, at most 64) are confirmed, in a burst.
	Window int
	// BatchSize is the most events claimed at once, 1-outbox.MaxBatch
	// (default outbox.MaxBatch). The next claim overlaps the publishing of
	// the previous one, so up to about twice as many events are claimed at
	// once; with a BatchSize below Window two claims run at once while
	// they come back full. Over a backlog the first claim takes fewer,
	// Window/16 (at least 32), and claims double while they come back
	// full, so the first events are published before a whole batch is
	// claimed.
	BatchSize int
	// Lease is the claim lease (default 30 s), extended every Lease/3 until
	// the event is settled. A held claim (PostgreSQL, see UseLeases) has no
	// lease to extend: the database ends its transaction when it stays idle
	// longer than Lease, or four times PublishTimeout if that is longer.
	Lease time.Duration
	// MaxAttempts dead-letters an event after this many failed publishes
	// (default outbox.MaxAttempts).
	MaxAttempts int
	// MaxBackoff is the longest retry delay after a failed publish: the
	// delay starts at 100 ms and doubles per attempt up to it (default
	// 10 s).
	MaxBackoff time.Duration
	// PublishTimeout bounds the wait for the broker's confirmation of one
	// publish (default 10 s); the event is then retried. (A Watermill
	// publisher's Publish that has not returned by then is left running:
	// if it succeeds later, the retry publishes the event a second time.)
	PublishTimeout time.Duration
	// CloseTimeout is how long a stopping relay waits for publishes in
	// flight (default 10 s).
	CloseTimeout time.Duration
	// PollInterval is how often an idle relay looks for events (default
	// 1 s on a PostgreSQL store that listens for notifications, which wake
	// the relay sooner; 50 ms otherwise).
	PollInterval time.Duration
	// Worker names this process in claimed rows (default host-pid-random).
	Worker string
	// UseLeases makes a relay on PostgreSQL claim events under leases, as
	// on the other databases, instead of holding each claimed batch in a
	// transaction until its events are published (outbox.Store.ClaimHeld).
	// A held batch writes each published event's row once instead of at
	// the claim and again at its acknowledgement; if the relay dies, its
	// events are due again at once instead of when their leases expire, and
	// the attempt is not counted. A held batch keeps one pooled connection
	// until its last publish is confirmed. At most three held batches per
	// stream are open at once, each of at most Window events (so a
	// BatchSize below Window/2 leaves part of the window unused), and the
	// database ends a held batch's transaction that stays idle longer than
	// Lease (at least four times PublishTimeout): its events are then
	// published again, and dropped as duplicates. A JetStream relay in
	// strict mode, or over another database, claims under leases whatever
	// this says.
	UseLeases bool
	// DeadLetterPolicy is the group's policy for a dead-lettered event
	// with an ordering key (default outbox.DeadLetterHold; strict mode
	// requires it).
	DeadLetterPolicy outbox.DeadLetterPolicy
	// Logger receives the relay's logs (default: none). Keys, payloads
	// and subjects are never logged.
	Logger *slog.Logger
	// MeterProvider receives the relay's metrics (see InstrumentationName
	// and the package's Metrics section); default the global one
	// (otel.GetMeterProvider), a no-op until the application installs an
	// OpenTelemetry SDK.
	MeterProvider metric.MeterProvider
}

func (c *Config) setDefaults() {
	if c.Group == "" {
		c.Group = DefaultGroup
	}
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = outbox.MaxAttempts
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = DefaultMaxBackoff
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = DefaultPublishTimeout
	}
	if c.CloseTimeout == 0 {
		c.CloseTimeout = DefaultCloseTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Worker == "" {
		c.Worker = defaultWorker()
	}
}

// defaultWorker names this process in claimed rows: host-pid-random, in
// the characters a worker name may hold.
func defaultWorker() string {
	host, _ := os.Hostname()
	host = strings.Map(func(r rune) rune {
		if r < 128 && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._:-", r)) {
			return r
		}
		return '-'
	}, host)
	if host == "" {
		host = "relay"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%.64s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

func (c *Config) validate() error {
	if len(c.Streams) == 0 {
		return fmt.Errorf("%w: no outbox stream to relay", ErrInvalidConfig)
	}
	for _, s := range c.Streams {
		if err := outbox.ValidateKey("stream", s); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	if err := outbox.ValidateKey("consumer group", c.Group); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if c.Window < 1 || c.Window > outbox.MaxBatch {
		return fmt.Errorf("%w: window %d is outside 1-%d", ErrInvalidConfig, c.Window, outbox.MaxBatch)
	}
	if c.MaxBackoff < 0 || c.MaxBackoff > outbox.MaxDelay {
		return fmt.Errorf("%w: max backoff %s is outside 0-%s", ErrInvalidConfig, c.MaxBackoff, outbox.MaxDelay)
	}
	if c.PublishTimeout < time.Millisecond {
		return fmt.Errorf("%w: publish timeout %s is below 1ms", ErrInvalidConfig, c.PublishTimeout)
	}
	if c.CloseTimeout < 0 {
		return fmt.Errorf("%w: close timeout %s is negative", ErrInvalidConfig, c.CloseTimeout)
	}
	if c.PollInterval < 0 || c.PollInterval > time.Hour {
		return fmt.Errorf("%w: poll interval %s is outside 0-1h", ErrInvalidConfig, c.PollInterval)
	}
	probe := outbox.ClaimRequest{Stream: c.Streams[0], Group: c.Group, Worker: c.Worker, Limit: c.BatchSize,
		Lease: c.Lease, MaxAttempts: c.MaxAttempts, DeadLetterPolicy: c.DeadLetterPolicy}
	if err := probe.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}

// heldIdle is the longest a held claim's transaction may stay idle before
// the database ends it: Lease, but at least (maxHeldClaims+1) times
// PublishTimeout, at most outbox.MaxLease. A held batch is claimed while up
// to maxHeldClaims-1 earlier batches (each at most Window events, one
// publish round) are still being published; if their publishes time out,
// it waits for each of them, then times out itself.
func (c *Config) heldIdle() time.Duration {
	return min(max(c.Lease, (maxHeldClaims+1)*c.PublishTimeout), outbox.MaxLease)
}

// RequiredDuplicateWindow is the shortest JetStream duplicate window that
// drops every re-publication after one interruption of the relay: a crash
// after the PubAck and before the outbox acknowledgement re-publishes the
// event when its lease expires (at most Lease after its last extension,
// itself at most PublishTimeout after the publish) or, with held claims
// (PostgreSQL unless UseLeases), at once, but a held batch whose
// transaction the database ended re-publishes its events up to the held
// batch's idle limit (Lease, at least four times PublishTimeout) after
// their claim; a publish whose PubAck was lost (timeout, broker restart)
// is retried after at most MaxBackoff. So: the longer of Lease and that
// limit (the lease's when UseLeases), plus MaxBackoff and PublishTimeout;
// 60 s by default. Repeated interruptions, or a broker outage longer than
// the margin, can re-publish an event later than this; strict mode has no
// such window.
func (c Config) RequiredDuplicateWindow() time.Duration {
	c.setDefaults()
	hold := c.Lease
	if !c.UseLeases {
		hold = max(hold, c.heldIdle())
	}
	return hold + c.MaxBackoff + c.PublishTimeout
}

// backoff is the retry delay after the given failed attempt.
func (c *Config) backoff(attempt int) time.Duration {
	d := 100 * time.Millisecond
	for i := 1; i < attempt && d < c.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, c.MaxBackoff)
}

// Stats counts what a relay did since it started.
type Stats struct {
	// Published counts events the broker confirmed as new messages.
	Published int64
	// Duplicates counts events the broker had already (a PubAck marked
	// Duplicate, or in strict mode the subject's last message): counted as
	// success and acknowledged.
	Duplicates int64
	// Failed counts failed publishes (each attempt), the unpublishable
	// ones included.
	Failed int64
	// DeadLettered counts events the relay dead-lettered: at once when
	// they can never be published, or after a failure at the attempt limit.
	DeadLettered int64
	// Conflicts counts strict-mode conflicts (ErrStrictConflict).
	Conflicts int64
}

type counters struct {
	published, duplicates, failed, dead, conflicts atomic.Int64
}

func (c *counters) snapshot() Stats {
	return Stats{Published: c.published.Load(), Duplicates: c.duplicates.Load(), Failed: c.failed.Load(),
		DeadLettered: c.dead.Load(), Conflicts: c.conflicts.Load()}
}

// runner consumes the relay's group on every outbox stream, each through a
// pipeline, and gives each claimed event to send.
type runner struct {
	store *outbox.Store
	cfg   Config
	tel   *telemetry
	// target names where the relay publishes, for the metrics.
	target func(stream string) string
	// send publishes one event and must call p.finish(it, …) exactly
	// once, on any goroutine, when the outcome is known.
	send    func(p *pipeline, it *item)
	stats   *counters
	running atomic.Bool
	// held: claims hold their events in transactions (PostgreSQL, unless
	// Config.UseLeases).
	held bool
}

// newRunner makes the runner of a relay whose configuration has its
// defaults and was validated.
func newRunner(store *outbox.Store, cfg Config, stats *counters, target func(string) string, send func(*pipeline, *item)) (*runner, error) {
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 50 * time.Millisecond
		if listening, _ := store.ListenerStatus(); listening {
			cfg.PollInterval = time.Second
		}
	}
	tel, err := newTelemetry(cfg.MeterProvider)
	if err != nil {
		return nil, err
	}
	held := store.Dialect() == "postgres" && !cfg.UseLeases
	return &runner{store: store, cfg: cfg, tel: tel, target: target, send: send, stats: stats, held: held}, nil
}

// item is one claimed event on its way through a pipeline. c points into
// the claim's slice (Store.Claim's result), not a copy of it.
type item struct {
	c         *outbox.Claimed
	claimedAt time.Time
	// hb is the held claim of the event (nil when claimed under a lease).
	hb *heldBatch
}

// result is the outcome of one publish.
type result struct {
	dup bool
	err error
	// dead dead-letters the event at once (it can never be published).
	dead bool
	// reason is the failure's class (a Reason constant); empty: from err.
	reason string
}

// register checks the schema and registers the relay's group for every
// stream (idempotent).
func (r *runner) register(ctx context.Context) error {
	if err := r.store.CheckSchema(ctx); err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	for _, stream := range r.cfg.Streams {
		if err := r.store.RegisterGroup(ctx, stream, r.cfg.Group, r.cfg.Kinds...); err != nil {
			return fmt.Errorf("relay: register the consumer group: %w", err)
		}
	}
	return nil
}

// run relays until ctx ends, then stops gracefully: events claimed but not
// yet published are released, publishes in flight are confirmed and
// acknowledged (up to CloseTimeout).
func (r *runner) run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: Run called twice", ErrInvalidConfig)
	}
	if err := r.register(ctx); err != nil {
		return err
	}
	ps := make([]*pipeline, len(r.cfg.Streams))
	for i, stream := range r.cfg.Streams {
		ps[i] = newPipeline(r, stream)
	}
	if reg, err := r.tel.observeInFlight(ps); err == nil {
		defer func() { _ = reg.Unregister() }()
	} else {
		r.cfg.Logger.Warn("relay: in-flight gauge not registered", "error", err.Error())
	}
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.run(ctx)
		}()
	}
	wg.Wait()
	return nil
}

// pipeline relays one outbox stream. Claimers claim batches of up to
// BatchSize events with Store.Claim (over a backlog, the first claims take
// fewer: see ramp) and hand them to the publisher; the next claim runs
// while the previous batch is being published, and with batches smaller
// than the window two run at once while claims come back full (see
// claimers). The publisher hands each event to send, at most
// Window unconfirmed at once (a full window resumes in bursts: see
// waitRoom). Confirmed events go to the
// acknowledger, which writes every acknowledgement waiting (up to
// outbox.MaxBatch) in one AcknowledgeBatch; failed ones go to Store.Fail
// (retry with backoff, dead letter at the limit). An extender renews the
// leases of every claimed, unsettled event every Lease/3.
//
// Per-key order needs nothing here: the outbox hands a consumer group at
// most one unsettled event per ordering key, so the events of one claim,
// and of all claims in flight, have distinct ordering keys, and the next
// event of a key is claimable only once this one is acknowledged, after its
// PubAck.
type pipeline struct {
	r      *runner
	stream string
	tel    *streamTelemetry

	stop    chan struct{}   // closed when the pipeline must stop claiming
	batches chan []*item    // claimed, not yet published
	more    chan struct{}   // a claim came back full: another claimer may claim
	kick    chan struct{}   // acknowledged ordered events: claim again now
	room    chan struct{}   // the window has room again (see publishLoop)
	acks    chan *item      // confirmed, to acknowledge
	fails   chan failedItem // failed, to settle with Store.Fail

	inflight sync.WaitGroup // one per send not finished
	// unconfirmed counts the sends not finished (the window in use): the
	// publisher adds, finish takes off.
	unconfirmed atomic.Int64
	// refill is how much room a full window must have again before the
	// publisher resumes (see publishLoop).
	refill int64

	sendMu sync.Mutex // guards closed against finish
	closed bool       // acks and fails are closed: late outcomes are dropped

	// ramp is the most the next claim takes: it starts small (firstClaim)
	// and doubles after each full claim up to BatchSize, so that the first
	// events of a backlog are published while the rest is being claimed
	// rather than after a claim of a whole batch; an empty claim resets it.
	ramp atomic.Int64

	// bound is the claims' lower bound over a backlog (see the package
	// claimbound): a claim steps over every event the relay holds
	// (claimed, not yet acknowledged: up to Window plus a batch).
	bound claimbound.Bound

	mu   sync.Mutex
	held map[int64]outbox.Receipt // claimed, unsettled (for lease extension)

	// Held claims (runner.held): slots bounds the claims open at once;
	// open lists them (under mu) so that a stop can end them; settling
	// counts settlements running.
	slots    chan struct{}
	open     map[*heldBatch]struct{}
	settling sync.WaitGroup
}

// firstClaim is the most the first claim over a backlog takes: a sixteenth
// of the window (at least 32), at most BatchSize.
func firstClaim(cfg Config) int {
	return min(max(cfg.Window/16, 32), cfg.BatchSize)
}

// growRamp doubles the ramp after a full claim of limit events, up to
// BatchSize (claims running at once may both grow it: the larger wins).
func (p *pipeline) growRamp(limit int) {
	next := int64(min(2*limit, p.r.cfg.BatchSize))
	for {
		cur := p.ramp.Load()
		if cur >= next || p.ramp.CompareAndSwap(cur, next) {
			return
		}
	}
}

type failedItem struct {
	it  *item
	res result
}

// maxBoundAge is the longest a pipeline's claim bound lives (a variable
// for tests; see SetMaxBoundAge in export_test.go).
var maxBoundAge = claimbound.DefaultMaxAge

func newPipeline(r *runner, stream string) *pipeline {
	p := &pipeline{
		r: r, stream: stream, tel: r.tel.forStream(stream, r.cfg.Group, r.target(stream)),
		stop:    make(chan struct{}),
		batches: make(chan []*item, 1),
		more:    make(chan struct{}, 1),
		kick:    make(chan struct{}, 1),
		room:    make(chan struct{}, 1),
		refill:  windowRefill(r.cfg.Window),
		acks:    make(chan *item, outbox.MaxBatch),
		fails:   make(chan failedItem, r.cfg.Window),
		held:    map[int64]outbox.Receipt{},
		slots:   make(chan struct{}, maxHeldClaims),
		open:    map[*heldBatch]struct{}{},
	}
	p.bound.MaxAge = maxBoundAge
	p.ramp.Store(int64(firstClaim(r.cfg)))
	return p
}

func (p *pipeline) run(ctx context.Context) {
	go func() {
		<-ctx.Done()
		close(p.stop)
	}()
	var claimer, background sync.WaitGroup
	for i := range claimers(p.r.cfg) {
		claimer.Add(1)
		go func() { defer claimer.Done(); p.claimLoop(i == 0) }()
	}
	published := make(chan struct{})
	go func() { defer close(published); p.publishLoop() }()
	acked := make(chan struct{})
	go func() { defer close(acked); p.ackLoop() }()
	failed := make(chan struct{})
	go func() { defer close(failed); p.failLoop() }()
	extendStop := make(chan struct{})
	background.Add(1)
	go func() { defer background.Done(); p.extendLoop(extendStop) }()

	claimer.Wait()
	<-published
	p.releaseQueued()
	// Publishes in flight: wait for their outcomes, for CloseTimeout.
	done := make(chan struct{})
	go func() { p.inflight.Wait(); close(done) }()
	timer := time.NewTimer(p.r.cfg.CloseTimeout)
	select {
	case <-done:
	case <-timer.C:
		p.r.cfg.Logger.Info("relay: publishes not confirmed before the close timeout; their events will be retried after their leases expire",
			"in_flight", p.unconfirmed.Load())
	}
	timer.Stop()
	p.sendMu.Lock()
	p.closed = true
	close(p.acks)
	close(p.fails)
	p.sendMu.Unlock()
	p.endHeld()
	p.settling.Wait()
	<-acked
	<-failed
	close(extendStop)
	background.Wait()
}

// opCtx bounds one database call: it outlives the Run context (a stopping
// relay still has acknowledgements to write) but not a hung connection.
func (p *pipeline) opCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), max(p.r.cfg.Lease/2, 5*time.Second))
}

// claimers is how many claims of a stream may run at once while it has a
// backlog (claims that come back full); an idle stream is polled by one.
// Claims skip each other's rows (SKIP LOCKED on PostgreSQL), so with
// batches smaller than the window two overlap the database's work (and its
// commit's flush) of one with the other's, keeping the window fed. A batch
// as large as the window needs no second claim: while one batch is being
// published the next waits queued and the claimer claims the one after,
// and a second claimer only makes every claim step over more claimed rows
// (and over the rows the other is locking) on its way to the due ones: on
// a 2-core machine relaying 10,000 events with Window and BatchSize 1000,
// it cost the database about 20% more CPU per event, for no throughput.
func claimers(cfg Config) int {
	if cfg.BatchSize >= cfg.Window {
		return 1
	}
	return 2
}

// maxEmptyClaimWait bounds the lead claimer's wait after an empty claim
// that took long (see emptyClaimWait).
const maxEmptyClaimWait = time.Second

// emptyClaimWait is the lead claimer's wait after a claim that found
// nothing, given its previous wait and how long the claim took: doubling
// from 1 ms up to pollInterval, and at least three times the claim's
// duration (up to maxEmptyClaimWait). An empty claim still reads every row
// the relay holds (claimed, unsettled) on its way to the due ones, so while
// the relay holds many it is slow, and polling again at once would keep the
// database busy with those rows, competing with the acknowledgements that
// settle them: empty claims take at most about a quarter of the lead's
// time. Wake-ups (notifications, acknowledged ordered events) still end
// the wait early.
func emptyClaimWait(prev, took, pollInterval time.Duration) time.Duration {
	const quick = time.Millisecond
	return max(min(max(2*prev, quick), pollInterval), min(3*took, maxEmptyClaimWait))
}

// claimLoop claims batches of up to BatchSize events and hands them to the
// publisher. The first claimer (lead) polls: after a wake-up, an
// acknowledgement of ordered events or a claim that found events it claims
// again quickly (1 ms, doubling while claims come back empty, up to
// PollInterval, but at least three times what a slow empty claim took: see
// emptyClaimWait), so events of transactions that commit just after a
// wake-up are found at once. The others claim only while claims come back
// full. Over a backlog, claims start above the events the last full claims
// took (see the package claimbound).
func (p *pipeline) claimLoop(lead bool) {
	var wake <-chan struct{}
	if lead {
		w, unwatch := p.r.store.Watch(p.stream, p.r.cfg.Group)
		defer unwatch()
		wake = w
	}
	idle := time.NewTimer(0)
	defer idle.Stop()
	failed := &backoff.ExponentialBackOff{
		InitialInterval: 50 * time.Millisecond, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: 5 * time.Second,
	}
	const quick = time.Millisecond
	var wait time.Duration
	for {
		if !lead {
			select {
			case <-p.stop:
				return
			case <-p.more:
			}
		}
		limit := int(p.ramp.Load())
		if p.r.held {
			// A held batch fits the window, so that it is published in one
			// go and its transaction stays open about one publish round.
			limit = min(limit, p.r.cfg.Window)
			if !p.takeSlot() {
				return
			}
		}
		ctx, cancel := p.opCtx()
		began := time.Now()
		after, gen := p.bound.Next(began)
		req := outbox.ClaimRequest{
			Stream: p.stream, Group: p.r.cfg.Group, Worker: p.r.cfg.Worker, Limit: limit, Lease: p.r.cfg.Lease,
			MaxAttempts: p.r.cfg.MaxAttempts, DeadLetterPolicy: p.r.cfg.DeadLetterPolicy, After: after,
		}
		var claimed []outbox.Claimed
		var hb *heldBatch
		var err error
		if p.r.held {
			var h *outbox.HeldClaim
			req.Lease = p.r.cfg.heldIdle()
			h, claimed, err = p.r.store.ClaimHeld(ctx, req)
			if h == nil {
				p.freeSlot()
			} else {
				hb = p.openHeld(h, len(claimed))
			}
		} else {
			claimed, err = p.r.store.Claim(ctx, req)
		}
		took := time.Since(began)
		cancel()
		if err == nil {
			var largest int64
			if len(claimed) > 0 {
				largest = claimed[len(claimed)-1].ID // oldest first
			}
			p.bound.Claimed(began, after, gen, len(claimed), limit, largest)
		}
		if err != nil {
			if !lead {
				continue // the lead retries with backoff
			}
			delay := failed.NextBackOff()
			p.r.cfg.Logger.Error("relay: claim failed; retrying", "error", err.Error(), "retry_in", delay.String())
			idle.Reset(delay)
			select {
			case <-p.stop:
				return
			case <-wake:
			case <-idle.C:
			}
			continue
		}
		failed.Reset()
		full := len(claimed) == limit
		switch {
		case full:
			p.growRamp(limit)
		case len(claimed) == 0 && after == 0:
			// Caught up: the next backlog starts small again. (A short
			// claim keeps the ramp: with ordering keys, claims often take
			// fewer events than they may; and a short claim above a bound
			// may have left due events below it.)
			p.ramp.Store(int64(firstClaim(p.r.cfg)))
		}
		if full {
			select { // another claimer may claim at once
			case p.more <- struct{}{}:
			default:
			}
		}
		if len(claimed) > 0 {
			now := time.Now()
			batch := make([]*item, len(claimed))
			// One allocation per claim: the claim's items (and, through
			// them, the claimed events and their payloads) stay in memory
			// until its last event settles, at most the publish timeout
			// after the others.
			items := make([]item, len(claimed))
			p.mu.Lock()
			for i := range claimed {
				c := &claimed[i]
				if hb == nil {
					p.held[c.ID] = c.Receipt()
				}
				items[i] = item{c: c, claimedAt: now, hb: hb}
				batch[i] = &items[i]
			}
			p.mu.Unlock()
			select {
			case p.batches <- batch:
			case <-p.stop:
				p.releaseItems(batch)
				return
			}
		}
		if !lead {
			continue
		}
		switch {
		case full, after != 0:
			// More may be due right now (a short claim above a bound:
			// below it).
			wait = 0
		case len(claimed) > 0:
			wait = quick
		default:
			wait = emptyClaimWait(wait, took, p.r.cfg.PollInterval)
		}
		if wait == 0 {
			select {
			case <-p.stop:
				return
			default:
				continue
			}
		}
		idle.Reset(wait)
	waiting:
		for {
			select {
			case <-p.stop:
				return
			case <-wake:
				if wait > quick {
					break waiting
				}
			case <-p.kick:
				break waiting
			case <-idle.C:
				break waiting
			}
		}
	}
}

// publishLoop hands claimed events to send, keeping at most Window
// unconfirmed. On stop, what it has not sent is released.
func (p *pipeline) publishLoop() {
	for {
		select { // stopping wins over a ready batch
		case <-p.stop:
			return
		default:
		}
		var batch []*item
		select {
		case <-p.stop:
			return
		case batch = <-p.batches:
		}
		for i, it := range batch {
			if !p.waitRoom() {
				p.releaseItems(batch[i:])
				return
			}
			p.unconfirmed.Add(1) // only here: see waitRoom
			p.inflight.Add(1)
			p.r.send(p, it)
		}
	}
}

// windowRefill is how many confirmations a full window of the given size
// waits for before the publisher resumes: an eighth of it, at most 64.
func windowRefill(window int) int64 {
	return int64(max(1, min(window/8, 64)))
}

// leaveWindow takes a finished publish off the window; the one that brings
// a window to Window-refill unconfirmed signals room (see waitRoom).
func (p *pipeline) leaveWindow() {
	if p.unconfirmed.Add(-1) == int64(p.r.cfg.Window)-p.refill {
		select {
		case p.room <- struct{}{}:
		default:
		}
	}
}

// waitRoom waits until the window has room for one more publish; false
// when the pipeline stops first. A full window resumes once refill of its
// publishes are confirmed, not at each confirmation: the publisher then
// sends a burst, which the connection writes together, instead of waking
// up for every PubAck (a goroutine hand-over per event, and a write of one
// message each, costing the client and the broker CPU). Only the publisher
// adds to unconfirmed, so a window seen full stays so until finish takes
// refill off, and the one finish that brings it to Window-refill signals
// room (buffered: a wait that begins after it still sees it).
func (p *pipeline) waitRoom() bool {
	for p.unconfirmed.Load() >= int64(p.r.cfg.Window) {
		select {
		case <-p.room:
		case <-p.stop:
			return false
		}
	}
	return true
}

// finish takes the outcome of one send: a confirmed event goes to the
// acknowledger, a failed one to Store.Fail. After the close timeout the
// outcome is dropped (the lease expires and the event is retried, then
// dropped as a duplicate if it had arrived).
func (p *pipeline) finish(it *item, res result) {
	defer p.inflight.Done()
	defer p.leaveWindow()
	ctx := context.Background()
	stats := p.r.stats
	if res.err == nil {
		if res.dup {
			stats.duplicates.Add(1)
		} else {
			stats.published.Add(1)
		}
		p.tel.confirmed(ctx, res.dup, it.claimedAt, it.c.CreatedAt)
	} else {
		if res.reason == "" {
			res.reason = reasonOf(res.err)
		}
		if res.reason == ReasonUnpublishable {
			res.dead = true
		}
		if errors.Is(res.err, ErrStrictConflict) {
			stats.conflicts.Add(1)
		}
		stats.failed.Add(1)
		p.tel.failed(ctx, res.reason)
	}
	if it.hb != nil {
		p.heldDone(it, &res)
		return
	}
	p.sendMu.Lock()
	defer p.sendMu.Unlock()
	if p.closed {
		return
	}
	if res.err == nil {
		p.acks <- it
	} else {
		p.fails <- failedItem{it: it, res: res}
	}
}

// ackLoop writes acknowledgements in batches: it waits for one, takes every
// other one already waiting (at most MaxBatch), and writes them in one
// statement.
func (p *pipeline) ackLoop() {
	batch := make([]outbox.Receipt, 0, cap(p.acks))
	for it := range p.acks {
		batch = append(batch[:0], it.c.Receipt())
		ordered := it.c.OrderingKey != ""
	more:
		for len(batch) < cap(p.acks) {
			select {
			case it, ok := <-p.acks:
				if !ok {
					break more
				}
				batch = append(batch, it.c.Receipt())
				ordered = ordered || it.c.OrderingKey != ""
			default:
				break more
			}
		}
		var stale []outbox.Receipt
		err := p.retry(func(ctx context.Context) error {
			var err error
			stale, err = p.r.store.AcknowledgeBatch(ctx, batch)
			return err
		})
		p.forget(batch...)
		switch {
		case err != nil:
			p.r.cfg.Logger.Error("relay: could not acknowledge published events; they will be published again after their leases expire (and dropped as duplicates)",
				"error", err.Error(), "events", len(batch))
		case len(stale) > 0:
			p.r.cfg.Logger.Info("relay: published events had lost their leases and may be published again (and dropped as duplicates)", "events", len(stale))
		}
		if ordered || len(stale) > 0 || err != nil {
			// The next events of their keys became claimable, or lost
			// leases make events due again: below the claims' bound.
			p.bound.Drop()
		}
		if ordered {
			// The next events of their keys became claimable.
			select {
			case p.kick <- struct{}{}:
			default:
			}
		}
	}
}

// failLoop settles failed publishes: pending again after the backoff, or
// dead-lettered at the attempt limit (at once when the event can never be
// published).
func (p *pipeline) failLoop() {
	for f := range p.fails {
		p.settleFailure(f)
	}
}

// settleFailure records one failed publish with Store.Fail.
func (p *pipeline) settleFailure(f failedItem) {
	cfg := &p.r.cfg
	c := f.it.c
	fl := outbox.Failure{Reason: outbox.SanitizeErrorText(failureText(f.res.err, c)), MaxAttempts: cfg.MaxAttempts,
		RetryDelay: cfg.backoff(c.Attempts), DeadLetterPolicy: cfg.DeadLetterPolicy}
	if f.res.dead {
		fl.MaxAttempts = min(max(c.Attempts, 1), outbox.MaxAttempts)
	}
	var out outbox.FailOutcome
	err := p.retry(func(ctx context.Context) error {
		var err error
		out, err = p.r.store.Fail(ctx, c.Receipt(), fl)
		return err
	})
	p.forget(c.Receipt())
	switch {
	case err != nil || (out.DeadLettered && c.OrderingKey != ""):
		// A lost lease makes the event due again; a dead-lettered head
		// may let the next event of its key go (DeadLetterSkip).
		p.bound.Drop()
	case !out.DeadLettered:
		p.bound.RetryAt(time.Now().Add(fl.RetryDelay))
	}
	switch {
	case errors.Is(err, outbox.ErrStaleClaim):
		cfg.Logger.Info("relay: a failed event had lost its lease; it is retried elsewhere")
	case err != nil:
		cfg.Logger.Error("relay: could not record a failed publish; the event will be retried after its lease expires", "error", err.Error())
	case out.DeadLettered:
		p.r.stats.dead.Add(1)
		p.tel.deadLettered(context.Background(), f.res.reason)
		cfg.Logger.Warn("relay: event dead-lettered", "attempts", c.Attempts, "reason", f.res.reason)
	default:
		cfg.Logger.Debug("relay: publish failed; the event will be retried", "error", fl.Reason)
	}
}

// failureText is the stored (and logged) reason of c's failed publish. The
// relay's own errors hold no key, subject or payload; a broker client's
// may quote the message id (the event key) or the subject (the stream, and
// the ordering key with OrderingKeySubject), so c's key, ordering key and
// stream are taken out of the error's text wherever one stands as a word
// of its own (a subject's dots and a colon end a word), as written and as
// a subject token (EncodeToken: a '.' of theirs is '~' there). Values of
// fewer than three characters are left: they would cut words apart.
func failureText(err error, c *outbox.Claimed) string {
	text := err.Error()
	secrets := []string{c.Key, c.OrderingKey, c.Stream}
	for _, v := range secrets[:3] {
		if t := EncodeToken(v); t != v {
			secrets = append(secrets, t)
		}
	}
	slices.SortFunc(secrets, func(a, b string) int { return len(b) - len(a) }) // a key holding another goes first
	for _, v := range secrets {
		if len(v) >= 3 {
			text = redactWord(text, v)
		}
	}
	switch {
	case errors.Is(err, ErrUnpublishable) || errors.Is(err, ErrStrictConflict):
		return text
	case errors.Is(err, nats.ErrMaxPayload):
		return fmt.Sprintf("%v: %s", ErrUnpublishable, text)
	default:
		return "relay: " + text
	}
}

// redactWord replaces each occurrence of v in text that no letter, digit,
// '_' or '-' adjoins with "[REDACTED]".
func redactWord(text, v string) string {
	inWord := func(b byte) bool {
		return b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || b == '_' || b == '-'
	}
	var b strings.Builder
	for {
		i := strings.Index(text, v)
		if i < 0 {
			b.WriteString(text)
			return b.String()
		}
		end := i + len(v)
		if (i > 0 && inWord(text[i-1])) || (end < len(text) && inWord(text[end])) {
			b.WriteString(text[:i+1])
			text = text[i+1:]
			continue
		}
		b.WriteString(text[:i])
		b.WriteString("[REDACTED]")
		text = text[end:]
	}
}

// retry runs op until it succeeds, fails with a stale claim, or Lease/2
// has passed, backing off from 50 ms to 1 s with jitter: long enough to
// ride out a database restart without giving up on acknowledgements. Once
// the pipeline is stopping it keeps trying for at most another second (the
// leases of what it gives up expire, and the events are retried).
func (p *pipeline) retry(op func(ctx context.Context) error) error {
	b := &backoff.ExponentialBackOff{InitialInterval: 50 * time.Millisecond, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: time.Second}
	deadline := time.Now().Add(p.r.cfg.Lease / 2)
	stop := p.stop
	for {
		ctx, cancel := p.opCtx()
		err := op(ctx)
		cancel()
		wait := b.NextBackOff()
		if err == nil || errors.Is(err, outbox.ErrStaleClaim) || time.Now().Add(wait).After(deadline) {
			return err
		}
		timer := time.NewTimer(wait)
		select {
		case <-stop:
			stop = nil
			if soon := time.Now().Add(time.Second); soon.Before(deadline) {
				deadline = soon
			}
			<-timer.C
		case <-timer.C:
		}
	}
}

// forget stops extending the leases of settled events.
func (p *pipeline) forget(rs ...outbox.Receipt) {
	p.mu.Lock()
	for _, r := range rs {
		if held, ok := p.held[r.ID]; ok && held.ClaimKey == r.ClaimKey {
			delete(p.held, r.ID)
		}
	}
	p.mu.Unlock()
}

// release hands claimed, unpublished events back at once.
func (p *pipeline) release(rs ...outbox.Receipt) {
	defer p.forget(rs...)
	defer p.bound.Drop() // the released events are due below the claims' bound
	for start := 0; start < len(rs); start += outbox.MaxBatch {
		chunk := rs[start:min(start+outbox.MaxBatch, len(rs))]
		ctx, cancel := p.opCtx()
		_, err := p.r.store.Release(ctx, chunk...)
		cancel()
		if err != nil {
			p.r.cfg.Logger.Error("relay: could not release claimed events; their leases will expire", "error", err.Error(), "events", len(chunk))
		}
	}
}

// releaseItems hands claimed, unpublished events back at once.
func (p *pipeline) releaseItems(items []*item) {
	var rs []outbox.Receipt
	for _, it := range items {
		if it.hb != nil {
			p.heldDone(it, nil) // left as it was when its claim ends
			continue
		}
		rs = append(rs, it.c.Receipt())
	}
	if len(rs) > 0 {
		p.release(rs...)
	}
}

// releaseQueued hands back every batch claimed but never published.
func (p *pipeline) releaseQueued() {
	var items []*item
	for {
		select {
		case batch := <-p.batches:
			items = append(items, batch...)
		default:
			p.releaseItems(items)
			return
		}
	}
}

// extendChunk is the most leases one extension statement renews.
const extendChunk = 250

// extendLoop renews the lease of every claimed, unsettled event every
// Lease/3, so a batch that takes long to publish (a slow broker, retries
// of the async publisher) keeps its claims.
func (p *pipeline) extendLoop(stop <-chan struct{}) {
	ticker := time.NewTicker(p.r.cfg.Lease / 3)
	defer ticker.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ticker.C:
		}
		p.mu.Lock()
		rs := make([]outbox.Receipt, 0, len(p.held))
		for _, r := range p.held {
			rs = append(rs, r)
		}
		p.mu.Unlock()
		slices.SortFunc(rs, func(a, b outbox.Receipt) int { return cmp.Compare(a.ID, b.ID) })
		lost := 0
		for start := 0; start < len(rs); start += extendChunk {
			chunk := rs[start:min(start+extendChunk, len(rs))]
			ctx, cancel := p.opCtx()
			_, stale, err := p.r.store.ExtendBatch(ctx, chunk, p.r.cfg.Lease)
			cancel()
			if err != nil {
				p.r.cfg.Logger.Error("relay: could not extend leases", "error", err.Error(), "events", len(chunk))
				p.bound.Drop() // the leases may expire: their events due below the claims' bound
				continue
			}
			// An event settled meanwhile is stale to Extend but not lost.
			p.mu.Lock()
			for _, r := range stale {
				if held, ok := p.held[r.ID]; ok && held.ClaimKey == r.ClaimKey {
					lost++
				}
			}
			p.mu.Unlock()
		}
		if lost > 0 {
			p.bound.Drop()
			p.r.cfg.Logger.Info("relay: some claimed events lost their leases and may be published elsewhere (and dropped as duplicates)", "events", lost)
		}
	}
}

// Metadata keys the outbox sets or that name the event itself: they become
// the relay's own headers (HeaderKind and the others) or are dropped.
var internalMetadata = []string{
	outbox.MetadataKind, outbox.MetadataEventKey, outbox.MetadataAttempt, outbox.MetadataEventID,
	outbox.MetadataOrderingKey, outbox.MetadataOrderingSeq, outbox.MetadataHandlerError, outbox.MetadataDeadLetterNow,
}

// userMetadata is the application's metadata of a claimed event: what a
// relay publishes besides its own headers.
func userMetadata(c *outbox.Claimed) map[string]string {
	md := make(map[string]string, len(c.Metadata))
	for k, v := range c.Metadata {
		if isUserMetadata(c, k, v) {
			md[k] = v
		}
	}
	return md
}

// isUserMetadata tells whether the metadata entry k=v of a claimed event is
// the application's (see userMetadata).
func isUserMetadata(c *outbox.Claimed, k, v string) bool {
	if slices.Contains(internalMetadata, k) || strings.HasPrefix(k, "millpond_") {
		return false
	}
	return k != outbox.MetadataCQRSName || v != c.Kind // the Subscriber's default
}
