package relay

import (
	"context"
	"fmt"
	"strconv"

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
	run   runner
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
	w.run = runner{store: store, cfg: cfg.Config, relayOne: w.relayOne}
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
	w.cfg.Logger.Info("relay stopped", "published", s.Published, "failed", s.Failed)
	return err
}

func (w *Watermill) relayOne(stream string, msg *message.Message) {
	ev := eventOf(stream, msg)
	out := message.NewMessage(ev.key, ev.payload)
	for k, v := range ev.metadata {
		out.Metadata.Set(k, v)
	}
	out.Metadata.Set(MetadataStream, ev.stream)
	out.Metadata.Set(MetadataKind, ev.kind)
	out.Metadata.Set(MetadataKey, ev.key)
	if ev.orderingKey != "" {
		out.Metadata.Set(MetadataOrderingKey, ev.orderingKey)
		out.Metadata.Set(MetadataOrderingSeq, strconv.FormatInt(ev.orderingSeq, 10))
	}
	if err := w.pub.Publish(w.cfg.Topic(stream), out); err != nil {
		w.stats.failed.Add(1)
		w.cfg.Logger.Debug("publish failed; the event will be retried", "error", err.Error())
		nack(msg, "relay: publish: "+err.Error(), false)
		return
	}
	w.stats.published.Add(1)
	msg.Ack()
}
