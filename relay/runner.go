package relay

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millpond/millpond/outbox"
)

// DefaultGroup is the consumer group a relay consumes when
// Config.Group is empty.
const DefaultGroup = "relay"

// Defaults of Config.
const (
	DefaultWindow         = 256
	DefaultBatchSize      = 500
	DefaultLease          = 30 * time.Second
	DefaultMaxBackoff     = 10 * time.Second
	DefaultPublishTimeout = 10 * time.Second
	DefaultCloseTimeout   = 10 * time.Second
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
	// yet confirmed at once, across keys, 1-outbox.MaxBatch (default 256).
	Window int
	// BatchSize is the most events claimed at once (default 500).
	BatchSize int
	// Lease is the claim lease (default 30 s), extended while a publish is
	// pending.
	Lease time.Duration
	// MaxAttempts dead-letters an event after this many failed publishes
	// (default outbox.MaxAttempts).
	MaxAttempts int
	// MaxBackoff is the longest retry delay after a failed publish: the
	// delay starts at 100 ms and doubles per attempt up to it (default
	// 10 s).
	MaxBackoff time.Duration
	// PublishTimeout bounds the wait for the broker's confirmation of one
	// publish (default 10 s); the event is then retried.
	PublishTimeout time.Duration
	// CloseTimeout is how long a stopping relay waits for publishes in
	// flight (default 10 s).
	CloseTimeout time.Duration
	// PollInterval is how often an idle relay looks for events (the
	// Subscriber's default when zero).
	PollInterval time.Duration
	// Worker names this process in claimed rows (default host-pid-random).
	Worker string
	// DeadLetterPolicy is the group's policy for a dead-lettered event
	// with an ordering key (default outbox.DeadLetterHold; strict mode
	// requires it).
	DeadLetterPolicy outbox.DeadLetterPolicy
	// Logger receives the relay's logs (default: none). Keys, payloads
	// and subjects are never logged.
	Logger *slog.Logger
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
	probe := outbox.ClaimRequest{Stream: c.Streams[0], Group: c.Group, Worker: "probe", Limit: c.BatchSize,
		Lease: c.Lease, MaxAttempts: c.MaxAttempts, DeadLetterPolicy: c.DeadLetterPolicy}
	if c.Worker != "" {
		probe.Worker = c.Worker
	}
	if err := probe.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}

// RequiredDuplicateWindow is the shortest JetStream duplicate window that
// drops every re-publication after one interruption of the relay: a crash
// after the PubAck and before the outbox acknowledgement re-publishes the
// event when its lease expires (at most Lease after its last extension,
// itself at most PublishTimeout after the publish); a publish whose PubAck
// was lost (timeout, broker restart) is retried after at most MaxBackoff.
// Repeated interruptions, or a broker outage longer than the margin, can
// re-publish an event later than this; strict mode has no such window.
func (c Config) RequiredDuplicateWindow() time.Duration {
	c.setDefaults()
	return c.Lease + c.MaxBackoff + c.PublishTimeout
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
	// Failed counts publishes that failed and were retried later.
	Failed int64
	// DeadLettered counts events that could never be published.
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

// runner consumes the relay's group on every stream and gives each message
// to relayOne on one of Window workers.
type runner struct {
	store    *outbox.Store
	cfg      Config
	relayOne func(stream string, msg *message.Message)
	running  atomic.Bool
}

// run subscribes and relays until ctx ends, then stops gracefully:
// publishes in flight are confirmed and acknowledged (up to CloseTimeout).
func (r *runner) run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: Run called twice", ErrInvalidConfig)
	}
	sub, err := outbox.NewSubscriber(r.store, outbox.SubscriberConfig{
		ConsumerGroup: r.cfg.Group, Kinds: r.cfg.Kinds, Worker: r.cfg.Worker,
		BatchSize: r.cfg.BatchSize, MaxInFlight: r.cfg.Window, Lease: r.cfg.Lease,
		MaxAttempts: r.cfg.MaxAttempts, Backoff: r.cfg.backoff, PollInterval: r.cfg.PollInterval,
		CloseTimeout: r.cfg.CloseTimeout, Logger: watermill.NewSlogLogger(r.cfg.Logger),
		DeadLetterPolicy: r.cfg.DeadLetterPolicy,
	})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	defer sub.Close()
	var wg sync.WaitGroup
	for _, stream := range r.cfg.Streams {
		msgs, err := sub.Subscribe(ctx, stream)
		if err != nil {
			return fmt.Errorf("relay: subscribe: %w", err)
		}
		// Window workers per stream; the Subscriber hands out at most
		// Window messages at once per stream, so that is the bound.
		for range r.cfg.Window {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for msg := range msgs {
					r.relayOne(stream, msg)
				}
			}()
		}
	}
	wg.Wait()
	return nil
}

// Metadata keys the outbox Subscriber sets or that name the event itself:
// they become the relay's own headers (HeaderKind and the others) or are
// dropped.
var internalMetadata = []string{
	outbox.MetadataKind, outbox.MetadataEventKey, outbox.MetadataAttempt, outbox.MetadataEventID,
	outbox.MetadataOrderingKey, outbox.MetadataOrderingSeq, outbox.MetadataHandlerError, outbox.MetadataDeadLetterNow,
}

// event is what a relay publishes, read back from the Subscriber's message.
type event struct {
	stream, key, kind, orderingKey string
	orderingSeq                    int64
	payload                        []byte
	metadata                       map[string]string // the application's metadata only
}

func eventOf(stream string, msg *message.Message) event {
	ev := event{stream: stream, key: msg.UUID, kind: msg.Metadata.Get(outbox.MetadataKind),
		orderingKey: msg.Metadata.Get(outbox.MetadataOrderingKey), payload: msg.Payload,
		metadata: make(map[string]string, len(msg.Metadata))}
	ev.orderingSeq, _ = strconv.ParseInt(msg.Metadata.Get(outbox.MetadataOrderingSeq), 10, 64)
	for k, v := range msg.Metadata {
		if slices.Contains(internalMetadata, k) || strings.HasPrefix(k, "millpond_") {
			continue
		}
		if k == outbox.MetadataCQRSName && v == ev.kind {
			continue // the Subscriber's default
		}
		ev.metadata[k] = v
	}
	return ev
}

// nack fails the message with a reason that holds no key, subject or
// payload; dead dead-letters it at once.
func nack(msg *message.Message, reason string, dead bool) {
	msg.Metadata.Set(outbox.MetadataHandlerError, outbox.SanitizeErrorText(reason))
	if dead {
		msg.Metadata.Set(outbox.MetadataDeadLetterNow, "true")
	}
	msg.Nack()
}
