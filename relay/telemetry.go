package relay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"

	"github.com/millpond/millpond/outbox"
)

// Metrics: a relay records OpenTelemetry metrics through Config's
// MeterProvider (the global one by default), with the outbox's conventions
// (see package outbox): names start with "millpond.relay.", attributes are
// bounded (messaging.system "millpond", messaging.destination.name the
// outbox stream, messaging.consumer.group.name the relay's group,
// AttrTarget, and AttrOutcome or AttrReason where said), never keys, ids,
// subjects or payloads.
//
//   - millpond.relay.published: events the broker stored as new messages.
//   - millpond.relay.duplicates: events the broker already had (a PubAck
//     marked Duplicate, or in strict mode the subject's last message).
//   - millpond.relay.failures: failed publishes, by AttrReason.
//   - millpond.relay.dead_lettered: events the relay dead-lettered, by
//     AttrReason (ReasonUnpublishable at once, or the reason of the last
//     failure at the attempt limit).
//   - millpond.relay.publish.latency: seconds from the claim of an event to
//     the broker's confirmation, by AttrOutcome ("published" or
//     "duplicate").
//   - millpond.relay.delivery.latency: seconds from the event's enqueue (its
//     created time, by the database's clock) to the broker's confirmation,
//     by this process's clock, by AttrOutcome.
//   - millpond.relay.in_flight: publishes sent and not yet confirmed (the
//     window in use), per outbox stream.

// InstrumentationName is the instrumentation scope of the relays' meters.
const InstrumentationName = "github.com/millpond/millpond/relay"

// Attribute keys of the relays' metrics, besides the messaging semantic
// conventions and outbox.AttrOutcome.
const (
	// AttrTarget is where the relay publishes: the JetStream stream's
	// name, or the Watermill topic.
	AttrTarget = attribute.Key("millpond.relay.target")
	// AttrReason is a failure's class: one of the Reason constants.
	AttrReason = attribute.Key("millpond.relay.reason")
)

// Failure classes, the values of AttrReason.
const (
	// ReasonTimeout: no confirmation within PublishTimeout.
	ReasonTimeout = "timeout"
	// ReasonNoResponders: no JetStream stream answered (the stream is
	// gone or does not capture the subject, or JetStream is unavailable).
	ReasonNoResponders = "no_responders"
	// ReasonConnection: the NATS connection was closed, draining or
	// reconnecting.
	ReasonConnection = "connection"
	// ReasonRejected: JetStream answered with an error (other than a
	// strict-mode sequence mismatch it resolved).
	ReasonRejected = "rejected"
	// ReasonStrictConflict: ErrStrictConflict.
	ReasonStrictConflict = "strict_conflict"
	// ReasonUnpublishable: ErrUnpublishable (dead-lettered at once).
	ReasonUnpublishable = "unpublishable"
	// ReasonPublisher: a Watermill publisher's error.
	ReasonPublisher = "publisher"
	// ReasonOther: any other error.
	ReasonOther = "other"
)

// Outcomes on the latency histograms (outbox.AttrOutcome).
const (
	// OutcomePublished: the event was published and confirmed (JetStream's
	// PubAck, or a Watermill publisher's Publish returning nil).
	OutcomePublished = "published"
	// OutcomeDuplicate: the stream already held the event (a PubAck marked
	// Duplicate or, in strict mode, the subject's last message), so it was
	// not stored again.
	OutcomeDuplicate = "duplicate"
)

// reasonOf classifies a publish error.
func reasonOf(err error) string {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, ErrUnpublishable), errors.Is(err, nats.ErrMaxPayload), errors.Is(err, nats.ErrBadHeaderMsg),
		errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum:
		return ReasonUnpublishable
	case errors.Is(err, ErrStrictConflict):
		return ReasonStrictConflict
	case errors.Is(err, jetstream.ErrAsyncPublishTimeout), errors.Is(err, nats.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return ReasonTimeout
	case errors.Is(err, nats.ErrNoResponders), errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, jetstream.ErrJetStreamNotEnabled):
		return ReasonNoResponders
	case errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrConnectionDraining), errors.Is(err, nats.ErrConnectionReconnecting),
		errors.Is(err, nats.ErrDisconnected), errors.Is(err, nats.ErrStaleConnection):
		return ReasonConnection
	case errors.As(err, &apiErr):
		return ReasonRejected
	default:
		return ReasonOther
	}
}

var secondsBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800}

// telemetry holds a relay's instruments.
type telemetry struct {
	published, duplicates, failures, dead metric.Int64Counter
	publishLatency, deliveryLatency       metric.Float64Histogram
	inFlight                              metric.Int64ObservableGauge
	meter                                 metric.Meter
}

func newTelemetry(mp metric.MeterProvider) (*telemetry, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(InstrumentationName)
	t := &telemetry{meter: m}
	var errs []error
	counter := func(name, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit("{event}"), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	hist := func(name, desc string) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc), metric.WithExplicitBucketBoundaries(secondsBuckets...))
		errs = append(errs, err)
		return h
	}
	t.published = counter("millpond.relay.published", "Events the broker stored as new messages.")
	t.duplicates = counter("millpond.relay.duplicates", "Events the broker already had (a PubAck marked duplicate, or in strict mode the subject's last message); acknowledged as published.")
	t.failures = counter("millpond.relay.failures", "Failed publishes, by reason; the event is retried with backoff or dead-lettered.")
	t.dead = counter("millpond.relay.dead_lettered", "Events the relay dead-lettered: unpublishable at once, or at the attempt limit.")
	t.publishLatency = hist("millpond.relay.publish.latency", "Time from claiming an event to the broker's confirmation.")
	t.deliveryLatency = hist("millpond.relay.delivery.latency", "Time from an event's enqueue (its created time, by the database's clock) to the broker's confirmation, by this process's clock.")
	var err error
	t.inFlight, err = m.Int64ObservableGauge("millpond.relay.in_flight", metric.WithUnit("{event}"),
		metric.WithDescription("Publishes sent and not yet confirmed (the window in use), per outbox stream."))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("relay: metrics: %w", err)
	}
	return t, nil
}

// observeInFlight registers the in-flight gauge's callback over the
// pipelines; the returned registration is unregistered when Run ends.
func (t *telemetry) observeInFlight(ps []*pipeline) (metric.Registration, error) {
	return t.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for _, p := range ps {
			o.ObserveInt64(t.inFlight, p.unconfirmed.Load(), p.tel.base)
		}
		return nil
	}, t.inFlight)
}

// streamTelemetry holds the prepared attribute sets of one outbox stream.
type streamTelemetry struct {
	t                    *telemetry
	base                 metric.MeasurementOption // system, stream, group, target
	published, duplicate metric.MeasurementOption // ... and outcome
	attrs                []attribute.KeyValue
	// The same options as the slices the instruments take: a call with a
	// slice of its own would allocate one per event (the instruments are
	// interfaces, so the slice escapes).
	baseAdd                    []metric.AddOption
	publishedRec, duplicateRec []metric.RecordOption

	mu      sync.Mutex
	reasons map[string]metric.MeasurementOption
}

func (t *telemetry) forStream(stream, group, target string) *streamTelemetry {
	attrs := []attribute.KeyValue{semconv.MessagingSystemKey.String(outbox.MessagingSystem), semconv.MessagingDestinationName(stream),
		semconv.MessagingConsumerGroupName(group), AttrTarget.String(target)}
	with := func(extra attribute.KeyValue) metric.MeasurementOption {
		return metric.WithAttributeSet(attribute.NewSet(append(append([]attribute.KeyValue{}, attrs...), extra)...))
	}
	st := &streamTelemetry{t: t, attrs: attrs, base: metric.WithAttributeSet(attribute.NewSet(attrs...)),
		published: with(outbox.AttrOutcome.String(OutcomePublished)), duplicate: with(outbox.AttrOutcome.String(OutcomeDuplicate)),
		reasons: map[string]metric.MeasurementOption{}}
	st.baseAdd = []metric.AddOption{st.base}
	st.publishedRec, st.duplicateRec = []metric.RecordOption{st.published}, []metric.RecordOption{st.duplicate}
	return st
}

func (st *streamTelemetry) reason(r string) metric.MeasurementOption {
	st.mu.Lock()
	defer st.mu.Unlock()
	opt, ok := st.reasons[r]
	if !ok { // the reasons are the few Reason constants
		opt = metric.WithAttributeSet(attribute.NewSet(append(append([]attribute.KeyValue{}, st.attrs...), AttrReason.String(r))...))
		st.reasons[r] = opt
	}
	return opt
}

// confirmed counts one confirmed publish and records its latencies.
func (st *streamTelemetry) confirmed(ctx context.Context, dup bool, claimedAt, createdAt time.Time) {
	now := time.Now()
	outcome := st.publishedRec
	if dup {
		st.t.duplicates.Add(ctx, 1, st.baseAdd...)
		outcome = st.duplicateRec
	} else {
		st.t.published.Add(ctx, 1, st.baseAdd...)
	}
	st.t.publishLatency.Record(ctx, now.Sub(claimedAt).Seconds(), outcome...)
	if !createdAt.IsZero() {
		st.t.deliveryLatency.Record(ctx, max(now.Sub(createdAt), 0).Seconds(), outcome...)
	}
}

func (st *streamTelemetry) failed(ctx context.Context, reason string) {
	st.t.failures.Add(ctx, 1, st.reason(reason))
}

func (st *streamTelemetry) deadLettered(ctx context.Context, reason string) {
	st.t.dead.Add(ctx, 1, st.reason(reason))
}
