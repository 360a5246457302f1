package relay

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millpond/millpond/outbox"
)

// Metadata keys the Watermill relay sets on every message it publishes,
// besides the event's own metadata. The message's UUID is the event's key.
const (
	// MetadataStream is the event's outbox stream.
	MetadataStream = "millpond_stream"
	// MetadataKind is the event's kind (outbox.MetadataKind).
	MetadataKind = outbox.MetadataKind
	// MetadataKey is the event's key (outbox.MetadataEventKey), also the
	// message's UUID.
	MetadataKey = outbox.MetadataEventKey
	// MetadataOrderingKey and MetadataOrderingSeq are the event's ordering
	// key and sequence, when it has one.
	MetadataOrderingKey = outbox.MetadataOrderingKey
	// MetadataOrderingSeq: see MetadataOrderingKey.
	MetadataOrderingSeq = outbox.MetadataOrderingSeq
)

// WatermillConfig configures a Watermill relay.
type WatermillConfig struct {
	Config
	// Topic maps an outbox stream to the publisher's topic (default: the
	// stream's name).
	Topic func(stream string) string
}

// Watermill relays outbox events to any Watermill message.Publisher
// (Kafka, AMQP, Google Pub/Sub, …), at least once: an event is
// acknowledged in the outbox after Publish returned nil, so a crash in
// between publishes it again. The message's UUID is the event's key, for
// consumers to drop duplicates. Events of one ordering key are published
// one after another; keys go in parallel (Window).
type Watermill struct {
	cfg   WatermillConfig
	pub   message.Publisher
	run   *runner
	stats counters
}

// NewWatermill returns a relay to pub. It does not close pub.
func NewWatermill(store *outbox.Store, pub message.Publisher, cfg WatermillConfig) (*Watermill, error) {
	if store == nil || pub == nil {
		return nil, fmt.Errorf("%w: nil store or publisher", ErrInvalidConfig)
	}
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Topic == nil {
		cfg.Topic = func(stream string) string { return stream }
	}
	w := &Watermill{cfg: cfg, pub: pub}
	var err error
	if w.run, err = newRunner(store, cfg.Config, &w.stats, cfg.Topic, w.send); err != nil {
		return nil, err
	}
	return w, nil
}

// Stats counts what the relay did since it started.
func (w *Watermill) Stats() Stats { return w.stats.snapshot() }

// Run relays until ctx ends, then stops gracefully (see JetStream.Run). It
// may be called once.
func (w *Watermill) Run(ctx context.Context) error {
	w.cfg.Logger.Info("relay started", "outbox_streams", len(w.cfg.Streams), "group", w.cfg.Group, "window", w.cfg.Window)
	err := w.run.run(ctx)
	s := w.Stats()
	w.cfg.Logger.Info("relay stopped", "published", s.Published, "failed", s.Failed, "dead_lettered", s.DeadLettered)
	return err
}

// send publishes one event on a goroutine of its own (Publish is
// synchronous; Window bounds the goroutines). A Publish that has not
// returned within PublishTimeout is counted as failed (ReasonTimeout), so
// that a hung publisher neither holds the window nor keeps a held batch
// open past its bound; its goroutine is left to return.
func (w *Watermill) send(p *pipeline, it *item) {
	var once sync.Once
	finish := func(res result) { once.Do(func() { p.finish(it, res) }) }
	timer := time.AfterFunc(w.cfg.PublishTimeout, func() {
		finish(result{err: fmt.Errorf("publish: no return within %s", w.cfg.PublishTimeout), reason: ReasonTimeout})
	})
	go func() {
		defer timer.Stop()
		c := it.c
		out := message.NewMessage(c.Key, c.Payload)
		for k, v := range userMetadata(c) {
			out.Metadata.Set(k, v)
		}
		out.Metadata.Set(MetadataStream, c.Stream)
		out.Metadata.Set(MetadataKind, c.Kind)
		out.Metadata.Set(MetadataKey, c.Key)
		if c.OrderingKey != "" {
			out.Metadata.Set(MetadataOrderingKey, c.OrderingKey)
			out.Metadata.Set(MetadataOrderingSeq, strconv.FormatInt(c.OrderingSeq, 10))
		}
		if err := w.pub.Publish(w.cfg.Topic(c.Stream), out); err != nil {
			finish(result{err: fmt.Errorf("publish: %w", err), reason: ReasonPublisher})
			return
		}
		finish(result{})
	}()
}
