// Package bus is millpond's in-process event bus: one Watermill router that
// routes events claimed from the outbox to typed handlers by event kind.
//
// Each handler gets its own outbox Subscriber in its own consumer group
// (the handler's name), registered for the handler's kind only, so several
// handlers of one kind each see every event with their own delivery state
// and retry policy. Router-level Watermill middleware (correlation ids,
// timeouts, retry, ...) applies to every handler. Prefer the handler's
// Policy (a backoff kept in the database, counted against MaxAttempts, that
// survives restarts) to Watermill's Retry middleware, which retries in
// memory: the Subscriber keeps extending the lease meanwhile, but those
// retries are not counted as attempts and a crash forgets them.
//
// Unrouted events: an event whose kind no handler of its stream subscribes
// to is kept in the stream's default consumer group "". The bus's
// UnroutedPolicy decides what happens to it (dead-letter by default, so it
// is visible in the dead-letter list with the reason).
//
// Renaming a handler: its name is its consumer group, a durable identity
// kept in the database, so a new name is a new group. Start registers the
// new group, which sees only events enqueued from then on. The old group
// stays registered (the database cannot tell that its handler is gone), so
// every new event of its kind still gets a row for it that nobody consumes,
// Stats and ListGroups count them, and the old group's events from before
// the new group registered (its backlog, and whatever was enqueued while no
// process ran) never reach the renamed handler. Start logs ErrUnservedGroup
// for such a group. Keep handler names stable; when one must change, drain
// the old group first (run the old name until Stats shows no backlog for
// it) or accept that its backlog is dropped, then retire it with
// Store.RetireGroup or "millpond groups unregister", which refuses while
// the group has pending or processing events unless told to discard them.
// Removing a handler leaves its group registered in the same way.
//
// Stop is graceful: no new claims, events claimed but not started are
// released at once, running handlers may finish (their acks are written)
// until the close timeout, and nothing is lost: what does not finish in time
// is retried after its lease.
package bus

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millpond/millpond/handlers"
	"github.com/millpond/millpond/internal/gostack"
	"github.com/millpond/millpond/outbox"
)

// UnroutedPolicy says what the bus does with events no handler subscribes to.
type UnroutedPolicy int

const (
	// UnroutedDeadLetter dead-letters them at once with the reason "no
	// handler for event kind K" (the default): visible, listable,
	// requeueable, never silently dropped.
	UnroutedDeadLetter UnroutedPolicy = iota
	// UnroutedKeep leaves them pending in the default group, where Stats
	// counts them.
	UnroutedKeep
	// UnroutedAcknowledge acknowledges and logs them: they are dropped.
	UnroutedAcknowledge
)

// Config configures a Bus. Zero values take the defaults.
type Config struct {
	// Subscriber holds defaults for every handler's subscriber (batch size,
	// lease, poll interval, close timeout, ...). ConsumerGroup and Kinds
	// are set per handler; a handler's Policy overrides MaxAttempts,
	// Backoff, Lease and MaxInFlight.
	Subscriber outbox.SubscriberConfig
	// Unrouted is the policy for events without a handler; New refuses
	// any value but the three below (ErrInvalidConfig).
	Unrouted UnroutedPolicy
	// CloseTimeout bounds a graceful stop (default: the subscribers' close
	// timeout plus 5 s). Negative is refused (ErrInvalidConfig).
	CloseTimeout time.Duration
	// Logger receives the router's and subscribers' logs.
	Logger watermill.LoggerAdapter
	// OtherGroups names consumer groups of the bus's streams that other
	// processes serve (another service's bus, a Watermill subscriber), so
	// that Start does not warn about them as unserved.
	OtherGroups []string
}

// Bus routes outbox events to handlers through one Watermill router.
type Bus struct {
	store    *outbox.Store
	cfg      Config
	router   *message.Router
	handlers []handlers.Handler
	streams  []string
	routed   []*message.Handler   // the router's handlers, for Health
	subs     []*outbox.Subscriber // their subscribers, in the same order

	mu      sync.Mutex
	started bool
	done    chan struct{} // closed when the router's Run returns
	runErr  error         // what Run returned, once done is closed
	// runReported is true when Start returned runErr already.
	runReported bool
}

// ErrDuplicateHandler reports two handlers with the same name.
var ErrDuplicateHandler = errors.New("bus: duplicate handler name")

// ErrInvalidConfig reports a Config value out of its bounds (an unknown
// Unrouted policy, a negative CloseTimeout) or a nil store.
var ErrInvalidConfig = errors.New("bus: invalid configuration")

// ErrStarted reports a second Start of the same bus.
var ErrStarted = errors.New("bus: already started")

// ErrUnservedGroup is logged, never returned, by Start for each consumer
// group registered for one of the bus's streams that none of its handlers
// serves and Config.OtherGroups does not name: usually the group of a
// renamed or removed handler, which keeps getting a row for every event of
// its kinds that nobody consumes (see the package documentation).
var ErrUnservedGroup = errors.New("bus: consumer group registered for a stream of the bus, served by none of its handlers")

// New returns a Bus over the store for the handlers. Add router-level
// middleware with Router().AddMiddleware before Start.
func New(store *outbox.Store, cfg Config, hs ...handlers.Handler) (*Bus, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: nil store", ErrInvalidConfig)
	}
	if cfg.Unrouted < UnroutedDeadLetter || cfg.Unrouted > UnroutedAcknowledge {
		return nil, fmt.Errorf("%w: unknown Unrouted policy %d", ErrInvalidConfig, int(cfg.Unrouted))
	}
	if cfg.CloseTimeout < 0 {
		return nil, fmt.Errorf("%w: CloseTimeout %s is negative", ErrInvalidConfig, cfg.CloseTimeout)
	}
	if cfg.Logger == nil {
		cfg.Logger = watermill.NopLogger{}
	}
	if cfg.Subscriber.Logger == nil {
		cfg.Subscriber.Logger = cfg.Logger
	}
	if cfg.Subscriber.CloseTimeout == 0 {
		cfg.Subscriber.CloseTimeout = 30 * time.Second
	}
	if cfg.CloseTimeout == 0 {
		cfg.CloseTimeout = cfg.Subscriber.CloseTimeout + 5*time.Second
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: cfg.CloseTimeout}, outbox.RedactingLogger(cfg.Logger))
	if err != nil {
		return nil, fmt.Errorf("bus: %w", err)
	}
	b := &Bus{store: store, cfg: cfg, router: router}
	// Keep a failed handler's error text, and its wish to skip retries, on
	// the message for the subscriber's Nack; as the first middleware it is
	// the outermost, where it grows the stack for the handler.
	router.AddMiddleware(recordFailure)
	names := map[string]bool{}
	streams := map[string]bool{}
	for _, h := range hs {
		if h == nil {
			return nil, errors.New("bus: nil handler")
		}
		// An empty name would be the default group and an empty kind every
		// kind: both would take events that are not the handler's.
		for field, v := range map[string]string{"handler name": h.Name(), "handler stream": h.Stream(), "handler kind": h.Kind()} {
			if err := outbox.ValidateKey(field, v); err != nil {
				return nil, fmt.Errorf("bus: handler %q: %w", h.Name(), err)
			}
		}
		if names[h.Name()] {
			return nil, fmt.Errorf("%w: %q", ErrDuplicateHandler, h.Name())
		}
		names[h.Name()] = true
		if err := b.addHandler(h); err != nil {
			return nil, err
		}
		streams[h.Stream()] = true
	}
	for s := range streams {
		b.streams = append(b.streams, s)
	}
	sort.Strings(b.streams)
	if cfg.Unrouted != UnroutedKeep {
		for _, s := range b.streams {
			if err := b.addUnrouted(s); err != nil {
				return nil, err
			}
		}
	}
	return b, nil
}

func (b *Bus) subscriberConfig(group string, kinds []string, p handlers.Policy) outbox.SubscriberConfig {
	c := b.cfg.Subscriber
	c.ConsumerGroup, c.Kinds = group, kinds
	if p.MaxAttempts != 0 {
		c.MaxAttempts = p.MaxAttempts
	}
	if p.Backoff != nil {
		c.Backoff = p.Backoff
	}
	if p.Lease != 0 {
		c.Lease = p.Lease
	}
	if p.MaxInFlight != 0 {
		c.MaxInFlight = p.MaxInFlight
	}
	switch p.DeadLetterPolicy {
	case handlers.DeadLetterHold:
		c.DeadLetterPolicy = outbox.DeadLetterHold
	case handlers.DeadLetterSkip:
		c.DeadLetterPolicy = outbox.DeadLetterSkip
	}
	if p.HoldClaims {
		c.HoldClaims = true
	}
	return c
}

func (b *Bus) addHandler(h handlers.Handler) error {
	if d := h.Policy().DeadLetterPolicy; d < handlers.DeadLetterDefault || d > handlers.DeadLetterSkip {
		return fmt.Errorf("%w: handler %s: unknown dead-letter policy %d", ErrInvalidConfig, h.Name(), int(d))
	}
	cfg := b.subscriberConfig(h.Name(), []string{h.Kind()}, h.Policy())
	// Start registers the group (RegisterGroups) before the router runs:
	// the subscriber need not register it a second time when the router
	// subscribes it (one write transaction less per handler at start).
	cfg.SkipRegistration = true
	sub, err := outbox.NewSubscriber(b.store, cfg)
	if err != nil {
		return fmt.Errorf("bus: handler %q: %w", h.Name(), err)
	}
	b.handlers = append(b.handlers, h)
	b.subs = append(b.subs, sub)
	kind := h.Kind()
	b.routed = append(b.routed, b.router.AddConsumerHandler(h.Name(), h.Stream(), sub, func(msg *message.Message) error {
		if got := msg.Metadata.Get(outbox.MetadataKind); got != kind {
			// Written while the group still took this kind (Start narrows the
			// subscription): dead-letter it with the reason rather than
			// acknowledge an event nobody handled. Its ordering key is not
			// held behind it, whatever the handler's policy: the handler
			// would refuse it again after any requeue.
			msg.Metadata.Set(outbox.MetadataDeadLetterSkip, "true")
			return handlers.Permanent(fmt.Errorf("handler %q takes kind %q, not %q", h.Name(), kind, got))
		}
		return h.Handle(msg)
	}))
	return nil
}

// addUnrouted consumes the default group of a stream, where events that no
// handler subscribes to wait.
func (b *Bus) addUnrouted(stream string) error {
	// Unrouted events are dead-lettered one by one: one must not hold the
	// later events of its ordering key in the default group.
	cfg := b.subscriberConfig("", nil, handlers.Policy{DeadLetterPolicy: handlers.DeadLetterSkip})
	cfg.SkipRegistration = true
	sub, err := outbox.NewSubscriber(b.store, cfg)
	if err != nil {
		return fmt.Errorf("bus: unrouted events of a stream: %w", err)
	}
	policy, logger := b.cfg.Unrouted, b.cfg.Logger
	b.subs = append(b.subs, sub)
	b.routed = append(b.routed, b.router.AddConsumerHandler("millpond.unrouted."+stream, stream, sub, func(msg *message.Message) error {
		kind := msg.Metadata.Get(outbox.MetadataKind)
		if policy == UnroutedAcknowledge {
			logger.Info("Acknowledged an event no handler subscribes to", watermill.LogFields{"event_kind": kind})
			return nil
		}
		return handlers.Permanent(fmt.Errorf("no handler for event kind %q", kind))
	}))
	return nil
}

// recordFailure keeps a failed handler's error text on the message and marks
// permanent failures for immediate dead-lettering.
//
// It is the router's first middleware, the outermost frame of a message's
// handling: it grows the goroutine's stack for the handler (see
// internal/gostack), where growing copies the fewest frames. The router
// handles every message in a new goroutine, whose first stack a typed
// handler's decoding outgrows.
func recordFailure(h message.HandlerFunc) message.HandlerFunc {
	record := outbox.RecordHandlerError(func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if handlers.IsPermanent(err) {
			msg.Metadata.Set(outbox.MetadataDeadLetterNow, "true")
		}
		return out, err
	})
	return func(msg *message.Message) ([]*message.Message, error) {
		gostack.Grow()
		return record(msg)
	}
}

// Router returns the Watermill router, to add middleware or plugins before
// Start.
func (b *Bus) Router() *message.Router { return b.router }

// Handlers returns the bus's handlers.
func (b *Bus) Handlers() []handlers.Handler { return b.handlers }

// RegisterGroups durably subscribes every handler's consumer group to its
// kind, and only to it (a kind the handler had before is dropped), so events
// published from now on are kept for it. Start calls it; call it yourself
// when publishers may run before the bus starts. It checks the schema first
// (Store.CheckSchema): on a database whose migrations have not run it fails
// with outbox.ErrSchemaOutdated.
func (b *Bus) RegisterGroups(ctx context.Context) error {
	if len(b.handlers) > 0 {
		// A database without the schema (its migrations not run) says so
		// with outbox.ErrSchemaOutdated, as Subscribe does, rather than
		// with the driver's missing table.
		if err := b.store.CheckSchema(ctx); err != nil {
			return fmt.Errorf("bus: register groups: %w", err)
		}
	}
	for _, h := range b.handlers {
		if err := b.store.SetGroupKinds(ctx, h.Stream(), h.Name(), h.Kind()); err != nil {
			return fmt.Errorf("bus: register handler %q: %w", h.Name(), err)
		}
	}
	return nil
}

// warnUnserved logs ErrUnservedGroup for every group registered for one of
// the bus's streams that no handler of the bus serves. Watermill's logger
// has no warning level; the check logs at error level, once per start.
func (b *Bus) warnUnserved(ctx context.Context) {
	if len(b.streams) == 0 {
		return
	}
	regs, err := b.store.RegisteredGroups(ctx, b.streams...)
	if err != nil {
		b.cfg.Logger.Error("Could not check for registered consumer groups that no handler serves", err, nil)
		return
	}
	served := map[[2]string]bool{}
	for _, h := range b.handlers {
		served[[2]string{h.Stream(), h.Name()}] = true
	}
	for _, r := range regs {
		if r.Group == "" || served[[2]string{r.Stream, r.Group}] || slices.Contains(b.cfg.OtherGroups, r.Group) {
			continue
		}
		kinds := strings.Join(r.Kinds, ",")
		if r.AllKinds {
			kinds = "*"
		}
		b.cfg.Logger.Error("A consumer group registered for a stream of this bus is served by none of its handlers: "+
			"a row is still written for it for every event of its kinds (a renamed or removed handler?). "+
			"If no other process consumes it, retire it (millpond groups unregister), "+
			"or name it in Config.OtherGroups", ErrUnservedGroup,
			watermill.LogFields{"stream": r.Stream, "consumer_group": r.Group, "event_kinds": kinds})
	}
}

// Start registers the handlers' groups, warns about registered groups of
// its streams that no handler serves (ErrUnservedGroup), runs the router in
// the background and returns once it is running (or ctx ends).
func (b *Bus) Start(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.started {
		return ErrStarted
	}
	if err := b.RegisterGroups(ctx); err != nil {
		return err
	}
	b.warnUnserved(ctx)
	b.started = true
	b.done = make(chan struct{})
	go func() {
		b.runErr = b.router.Run(context.Background())
		close(b.done)
	}()
	select {
	case <-b.router.Running():
		return nil
	case <-b.done:
		b.runReported = true
		return fmt.Errorf("bus: router stopped: %w", b.runErr)
	case <-ctx.Done():
		_ = b.router.Close()
		return ctx.Err()
	}
}

// Stop stops the bus gracefully (see the package documentation) and waits
// until every handler has finished or ctx ends. Calling it again, or on a
// bus that never started, returns at once.
func (b *Bus) Stop(ctx context.Context) error {
	b.mu.Lock()
	started, done, reported := b.started, b.done, b.runReported
	b.mu.Unlock()
	if !started {
		return nil
	}
	select {
	case <-done:
		// The router stopped already (a Start that failed, or a run that
		// ended): closing it would wait for handlers it never ran.
		if err := b.waitHandlers(ctx); err != nil {
			return fmt.Errorf("bus: stop: %w", err)
		}
		if b.runErr != nil && !reported {
			return fmt.Errorf("bus: stop: %w", b.runErr)
		}
		return nil
	default:
	}
	closed := make(chan error, 1)
	go func() { closed <- b.router.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			return fmt.Errorf("bus: stop: %w", err)
		}
	case <-ctx.Done():
		return fmt.Errorf("bus: stop: %w", ctx.Err())
	}
	select {
	case <-done:
		if err := b.waitHandlers(ctx); err != nil {
			return fmt.Errorf("bus: stop: %w", err)
		}
		if b.runErr != nil {
			return fmt.Errorf("bus: stop: %w", b.runErr)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("bus: stop: %w", ctx.Err())
	}
}

// waitHandlers waits, once the router's Run has returned, until the
// goroutine of every handler the router ran has ended. Watermill's Run
// returns as soon as the handlers are done with their messages, while
// their goroutines still log their last lines (through the bus's logger):
// without this wait Stop would return with the bus still calling the
// logger, which a caller may be closing, flushing or reading by then.
func (b *Bus) waitHandlers(ctx context.Context) error {
	for _, h := range b.routed {
		select {
		case <-h.Started():
		default:
			continue // never ran: it has no goroutine
		}
		select {
		case <-h.Stopped():
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
