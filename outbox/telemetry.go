package outbox

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// Telemetry: millpond records OpenTelemetry metrics and traces through the
// MeterProvider, TracerProvider and propagator the application passes
// (WithMeterProvider, WithTracerProvider, WithPropagator), the global ones
// by default, so that with no OpenTelemetry SDK installed it costs next to
// nothing. docs/architecture.md lists every instrument and span.

// InstrumentationName is the instrumentation scope of millpond's meters and
// tracers.
const InstrumentationName = "github.com/millpond/millpond/outbox"

// MessagingSystem is the value of the messaging.system attribute on
// millpond's spans and metrics.
const MessagingSystem = "millpond"

// DefaultStatsInterval is how long one Stats snapshot serves the backlog
// gauges, readiness reports and CachedStats before it is read again.
const DefaultStatsInterval = 15 * time.Second

// Attribute keys of millpond's own, besides the OpenTelemetry messaging
// semantic conventions (messaging.system, messaging.destination.name for
// the stream, messaging.consumer.group.name for the consumer group,
// messaging.operation.type, messaging.message.id on spans only). Metric
// attributes are bounded: stream, group, kind, outcome and state; never
// event keys, ids, ordering keys or payloads.
const (
	// AttrEventKind is the event kind.
	AttrEventKind = attribute.Key("millpond.event.kind")
	// AttrOutcome is how a handling ended: "ack" or "nack" on
	// millpond.handler.duration; on the consumer span only when it was not
	// acked: "nack", or "released"/"timeout" for a message never settled;
	// how a held batch ended on millpond.held_batches.
	AttrOutcome = attribute.Key("millpond.outcome")
	// AttrAttempt is the attempt number of a handling, on the consumer
	// span (1 for the first).
	AttrAttempt = attribute.Key("millpond.attempt")
	// AttrState is a backlog state on millpond.backlog: "pending" (waiting
	// for its first attempt), "retrying" (waiting for another attempt
	// after a failure), "processing" (claimed), "blocked" (waiting behind
	// an earlier event of its ordering key) or "dead" (dead-lettered).
	// The states do not overlap.
	AttrState = attribute.Key("millpond.state")
)

// WithMeterProvider sets the MeterProvider of the store's metrics and of
// the Subscribers (and so the buses) made over it; the default is the
// global one (otel.GetMeterProvider), a no-op until the application
// installs an SDK.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(o *storeOptions) { o.meterProvider = mp }
}

// WithTracerProvider sets the TracerProvider of the producer spans of
// Enqueue and Publish and of the consumer span of every handling by a
// Subscriber (and so the bus); the default is the global one
// (otel.GetTracerProvider).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *storeOptions) { o.tracerProvider = tp }
}

// WithPropagator sets the propagator that writes the trace context into an
// enqueued event's metadata and reads it back on delivery; the default is
// the application's global one (otel.GetTextMapPropagator), which an SDK
// set-up usually makes W3C trace context plus baggage:
// propagation.NewCompositeTextMapPropagator(propagation.TraceContext{},
// propagation.Baggage{}).
func WithPropagator(p propagation.TextMapPropagator) Option {
	return func(o *storeOptions) { o.propagator = p }
}

// WithStatsInterval sets how long one Stats snapshot serves the backlog
// gauges, readiness reports and CachedStats (default DefaultStatsInterval):
// however often metrics are collected, the store runs at most one Stats
// query per interval, and that one query feeds every gauge. A negative
// interval turns the gauges off (use it on every store but one when
// several stores of a process share a database, or the gauges repeat);
// CachedStats then queries every time. A metrics collection whose context
// has no deadline (the Prometheus exporter's) bounds the query at 5 s; while
// it fails, the gauges are absent from the collection.
func WithStatsInterval(d time.Duration) Option {
	return func(o *storeOptions) { o.statsInterval = d }
}

// telemetry holds a store's instruments.
type telemetry struct {
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator // nil: the global one, read at use

	enqueued     metric.Int64Counter
	claimed      metric.Int64Counter
	reclaimed    metric.Int64Counter
	acknowledged metric.Int64Counter
	retried      metric.Int64Counter
	deadLettered metric.Int64Counter
	heldBatches  metric.Int64Counter
	handlerTime  metric.Float64Histogram
	latency      metric.Float64Histogram
	batchSize    metric.Int64Histogram
	statsTime    metric.Float64Histogram

	backlog      metric.Int64ObservableGauge
	oldestAge    metric.Float64ObservableGauge
	deadLetters  metric.Int64ObservableGauge
	blocked      metric.Int64ObservableGauge
	heldKeys     metric.Int64ObservableGauge
	registration metric.Registration // the gauges' callback, nil when off

	mu         sync.Mutex
	enqueueSet map[[2]string]metric.MeasurementOption // (stream, kind)
}

// secondsBuckets are the histogram bounds of durations, in seconds.
var secondsBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800}

// batchBuckets are the histogram bounds of claim batch sizes.
var batchBuckets = []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000}

var systemAttr = semconv.MessagingSystemKey.String(MessagingSystem)

func newTelemetry(o storeOptions) (*telemetry, error) {
	mp, tp := o.meterProvider, o.tracerProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	m := mp.Meter(InstrumentationName)
	t := &telemetry{tracer: tp.Tracer(InstrumentationName), propagator: o.propagator, enqueueSet: map[[2]string]metric.MeasurementOption{}}
	var errs []error
	counter := func(name, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit("{event}"), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	t.enqueued = counter("millpond.events.enqueued", "Events recorded by Enqueue or Publish (duplicates of an idempotency key not counted), whether or not their transaction then committed.")
	t.claimed = counter("millpond.events.claimed", "Events claimed by a Subscriber, reclaims included.")
	t.reclaimed = counter("millpond.events.reclaimed", "Events claimed again by a Subscriber because an earlier claim's lease expired unsettled.")
	t.acknowledged = counter("millpond.events.acknowledged", "Events whose acknowledgement a Subscriber wrote, or that a handler acknowledged in its own transaction.")
	t.retried = counter("millpond.events.retried", "Events failed by a Subscriber (Nack) and scheduled for another attempt.")
	t.deadLettered = counter("millpond.events.dead_lettered", "Events dead-lettered by a Subscriber after a Nack (at the attempt limit, or at once for a permanent failure).")
	var err error
	t.heldBatches, err = m.Int64Counter("millpond.held_batches", metric.WithUnit("{batch}"),
		metric.WithDescription("Batches a Subscriber held (HoldClaims) and ended, by outcome: settled, settled_early (still open after Lease/3: the rest leased), lost (the settle failed: its events due again), aborted (nothing to settle)."))
	errs = append(errs, err)
	hist := func(name, desc string) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc), metric.WithExplicitBucketBoundaries(secondsBuckets...))
		errs = append(errs, err)
		return h
	}
	t.handlerTime = hist("millpond.handler.duration", "Time from handing a message to the handler to its Ack or Nack.")
	t.latency = hist("millpond.delivery.latency", "Time from an event's enqueue (its created time, by the database's clock) to its hand-out to a handler, by this process's clock.")
	t.statsTime = hist("millpond.stats.duration", "Duration of the Stats queries behind the backlog gauges; its count is the number of queries.")
	t.batchSize, err = m.Int64Histogram("millpond.claim.batch_size", metric.WithUnit("{event}"),
		metric.WithDescription("Events per claim that found any."), metric.WithExplicitBucketBoundaries(batchBuckets...))
	errs = append(errs, err)
	t.backlog, err = m.Int64ObservableGauge("millpond.backlog", metric.WithUnit("{event}"),
		metric.WithDescription("Undelivered events per stream, consumer group and state (pending, retrying, processing, blocked, dead), from the cached Stats snapshot."))
	errs = append(errs, err)
	t.oldestAge, err = m.Float64ObservableGauge("millpond.backlog.oldest_age", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest pending, blocked or processing event per stream and consumer group (0 when none), from the cached Stats snapshot."))
	errs = append(errs, err)
	t.deadLetters, err = m.Int64ObservableGauge("millpond.dead_letters", metric.WithUnit("{event}"),
		metric.WithDescription("Dead-lettered events per stream and consumer group, from the cached Stats snapshot."))
	errs = append(errs, err)
	t.blocked, err = m.Int64ObservableGauge("millpond.blocked_events", metric.WithUnit("{event}"),
		metric.WithDescription("Events waiting behind an earlier event of their ordering key, per stream and consumer group, from the cached Stats snapshot."))
	errs = append(errs, err)
	t.heldKeys, err = m.Int64ObservableGauge("millpond.held_keys", metric.WithUnit("{key}"),
		metric.WithDescription("Ordering keys held by a dead letter (their later events wait), per stream and consumer group, from the cached Stats snapshot."))
	errs = append(errs, err)
	for _, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("outbox: metrics: %w", err)
		}
	}
	return t, nil
}

// registerGauges makes one callback, backed by the store's stats cache,
// serve every gauge.
func (t *telemetry) registerGauges(mp metric.MeterProvider, s *Store) error {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	reg, err := mp.Meter(InstrumentationName).RegisterCallback(s.observeStats, t.backlog, t.oldestAge, t.deadLetters, t.blocked, t.heldKeys)
	if err != nil {
		return fmt.Errorf("outbox: metrics: %w", err)
	}
	t.registration = reg
	return nil
}

func (t *telemetry) close() {
	if t.registration != nil {
		_ = t.registration.Unregister()
	}
}

func (t *telemetry) prop() propagation.TextMapPropagator {
	if t.propagator != nil {
		return t.propagator
	}
	return otel.GetTextMapPropagator()
}

// countEnqueued counts one inserted event.
func (t *telemetry) countEnqueued(ctx context.Context, stream, kind string) {
	if !t.enqueued.Enabled(ctx) {
		return
	}
	k := [2]string{stream, kind}
	t.mu.Lock()
	opt, ok := t.enqueueSet[k]
	if !ok {
		opt = metric.WithAttributeSet(attribute.NewSet(systemAttr, semconv.MessagingDestinationName(stream), AttrEventKind.String(kind)))
		if len(t.enqueueSet) < maxAttrSets {
			t.enqueueSet[k] = opt
		}
	}
	t.mu.Unlock()
	t.enqueued.Add(ctx, 1, opt)
}

// maxAttrSets bounds each cache of prepared attribute sets (the sets
// themselves are bounded by the application's streams and kinds).
const maxAttrSets = 1024

// startSend starts the producer span of an enqueue and returns ctx with it,
// and metadata with the trace context of that ctx injected (a copy: the
// caller's map is never changed). Metadata is returned as is when ctx
// carries neither a span context nor baggage.
func (t *telemetry) startSend(ctx context.Context, ev Event) (context.Context, trace.Span, map[string]string) {
	name := "send"
	attrs := []attribute.KeyValue{systemAttr, semconv.MessagingOperationTypeSend, semconv.MessagingOperationName("enqueue")}
	if ValidateKey("stream", ev.Stream) == nil {
		name += " " + ev.Stream
		attrs = append(attrs, semconv.MessagingDestinationName(ev.Stream))
	}
	ctx, span := t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
	if !trace.SpanContextFromContext(ctx).IsValid() && baggage.FromContext(ctx).Len() == 0 {
		return ctx, span, ev.Metadata
	}
	md := make(map[string]string, len(ev.Metadata)+3)
	maps.Copy(md, ev.Metadata)
	t.prop().Inject(ctx, propagation.MapCarrier(md))
	return ctx, span, md
}

// endSend ends an enqueue's producer span. It does not add the row id
// (known only now): an attribute set after the start costs every enqueue
// an attribute merge; the consumer spans carry it.
func endSend(span trace.Span, err error) {
	if err != nil {
		span.SetStatus(codes.Error, "enqueue failed")
	}
	span.End()
}

// hasTraceContext tells whether metadata may hold a trace context or
// baggage for the propagator to extract: any key but those millpond and
// Watermill set themselves.
func hasTraceContext(md map[string]string) bool {
	return len(md) > 0 && !onlyMillpondKeys(md)
}

// onlyMillpondKeys reports metadata that holds only keys millpond and
// Watermill set themselves, which no propagator reads.
func onlyMillpondKeys(md map[string]string) bool {
	for k := range md {
		switch k {
		case MetadataKind, MetadataCQRSName, MetadataEventKey, MetadataOrderingKey:
		default:
			return false
		}
	}
	return true
}

// subTelemetry is one subscription's share of the store's telemetry: the
// attribute sets of its stream, group and each kind, made once.
type subTelemetry struct {
	t      *telemetry
	stream string
	group  string
	base   metric.MeasurementOption // stream and group
	name   string                   // the consumer span's name

	mu    sync.Mutex
	kinds map[string]*kindTelemetry
}

// kindTelemetry holds the prepared attributes of one kind.
type kindTelemetry struct {
	attrs metric.MeasurementOption // stream, group, kind
	// The options of each handling's measurements, as slices passed on
	// whole: an option passed alone to a variadic interface method is put
	// in a slice of its own, on the heap, at every call.
	latency []metric.RecordOption // attrs
	ack     []metric.RecordOption // ... and outcome ack
	nack    []metric.RecordOption // ... and outcome nack
	span    []attribute.KeyValue  // the consumer span's fixed attributes
	// starts holds *spanStart values for this kind's consumer spans.
	starts sync.Pool
}

// spanStart is the start options of one consumer span, kept for reuse:
// attrs holds the kind's fixed attributes followed by the message's id and
// attempt, which are set before each start, and opts refers to attrs. A
// tracer copies the attributes while it starts the span
// (trace.NewSpanStartConfig appends them to its own slice), so that after
// Start returns the value can serve the next message: a handling then
// allocates neither the attribute slice nor the options.
type spanStart struct {
	attrs []attribute.KeyValue
	opts  []trace.SpanStartOption
}

// consumerKind is the span kind option of every consumer span.
var consumerKind = trace.WithSpanKind(trace.SpanKindConsumer)

func (k *kindTelemetry) spanStart() *spanStart {
	if p, ok := k.starts.Get().(*spanStart); ok {
		return p
	}
	attrs := append(make([]attribute.KeyValue, 0, len(k.span)+2), k.span...)
	attrs = append(attrs, semconv.MessagingMessageID(""), AttrAttempt.Int(0))
	return &spanStart{attrs: attrs, opts: []trace.SpanStartOption{consumerKind, trace.WithAttributes(attrs...)}}
}

func (t *telemetry) forSubscription(stream, group string) *subTelemetry {
	return &subTelemetry{t: t, stream: stream, group: group, name: "process " + stream,
		base:  metric.WithAttributeSet(attribute.NewSet(systemAttr, semconv.MessagingDestinationName(stream), semconv.MessagingConsumerGroupName(group))),
		kinds: map[string]*kindTelemetry{}}
}

func (st *subTelemetry) kind(kind string) *kindTelemetry {
	st.mu.Lock()
	defer st.mu.Unlock()
	if k, ok := st.kinds[kind]; ok {
		return k
	}
	base := []attribute.KeyValue{systemAttr, semconv.MessagingDestinationName(st.stream), semconv.MessagingConsumerGroupName(st.group), AttrEventKind.String(kind)}
	with := func(extra ...attribute.KeyValue) metric.MeasurementOption {
		return metric.WithAttributeSet(attribute.NewSet(append(append([]attribute.KeyValue{}, base...), extra...)...))
	}
	attrs := with()
	k := &kindTelemetry{attrs: attrs, latency: []metric.RecordOption{attrs},
		ack: []metric.RecordOption{with(AttrOutcome.String("ack"))}, nack: []metric.RecordOption{with(AttrOutcome.String("nack"))},
		span: append(append([]attribute.KeyValue{}, base...), semconv.MessagingOperationTypeProcess, semconv.MessagingOperationName("process"))}
	if len(st.kinds) < maxAttrSets {
		st.kinds[kind] = k
	}
	return k
}

// claimed counts a claim's events: one Add per kind of the batch (and one
// per kind with reclaims), not one per event.
func (st *subTelemetry) claimed(ctx context.Context, cs []Claimed) {
	if len(cs) == 0 || !st.t.claimed.Enabled(ctx) {
		return
	}
	st.t.batchSize.Record(ctx, int64(len(cs)), st.base)
	type count struct{ claimed, reclaimed int64 }
	add := func(kind string, n count) {
		k := st.kind(kind)
		st.t.claimed.Add(ctx, n.claimed, k.attrs)
		if n.reclaimed > 0 {
			st.t.reclaimed.Add(ctx, n.reclaimed, k.attrs)
		}
	}
	var first count // the events of cs[0]'s kind; a batch usually has one kind
	var others map[string]count
	for _, c := range cs {
		var reclaimed int64
		if c.Reclaimed {
			reclaimed = 1
		}
		if c.Kind == cs[0].Kind {
			first.claimed++
			first.reclaimed += reclaimed
			continue
		}
		if others == nil {
			others = map[string]count{}
		}
		o := others[c.Kind]
		o.claimed++
		o.reclaimed += reclaimed
		others[c.Kind] = o
	}
	add(cs[0].Kind, first)
	for kind, n := range others {
		add(kind, n)
	}
}

// acknowledged counts n acknowledged events of a kind.
func (st *subTelemetry) acknowledged(ctx context.Context, kind string, n int) {
	if n > 0 {
		st.t.acknowledged.Add(ctx, int64(n), st.kind(kind).attrs)
	}
}

// heldBatchEnded counts a held batch's end (see telemetry.heldBatches).
func (st *subTelemetry) heldBatchEnded(ctx context.Context, outcome string) {
	if st.t.heldBatches.Enabled(ctx) {
		st.t.heldBatches.Add(ctx, 1, metric.WithAttributes(systemAttr, semconv.MessagingDestinationName(st.stream),
			semconv.MessagingConsumerGroupName(st.group), AttrOutcome.String(outcome)))
	}
}

// failed counts a Nack's outcome.
func (st *subTelemetry) failed(ctx context.Context, kind string, dead bool) {
	if dead {
		st.t.deadLettered.Add(ctx, 1, st.kind(kind).attrs)
	} else {
		st.t.retried.Add(ctx, 1, st.kind(kind).attrs)
	}
}

// handling is one message's consumer span and handler timing.
type handling struct {
	st    *subTelemetry
	kind  *kindTelemetry
	span  trace.Span
	start time.Time
}

// startProcess starts the consumer span of one handling, as a child of the
// producer's span context carried in the event's metadata, unless ctx
// already carries a span: then that is the parent and the producer's span
// is linked. eventID is c.ID in decimal, as the message's metadata has it.
// It fills h (the caller's, which can then stay on its stack) and returns
// the context for the message.
func (st *subTelemetry) startProcess(ctx context.Context, c Claimed, eventID string, h *handling) context.Context {
	k := st.kind(c.Kind)
	*h = handling{st: st, kind: k}
	p := k.spanStart()
	opts := p.opts
	if hasTraceContext(c.Metadata) {
		if !trace.SpanContextFromContext(ctx).IsValid() {
			// The usual case: the propagator puts the producer's span
			// context (the parent) and baggage straight into ctx.
			ctx = st.t.prop().Extract(ctx, propagation.MapCarrier(c.Metadata))
		} else {
			produced := st.t.prop().Extract(context.Background(), propagation.MapCarrier(c.Metadata))
			if sc := trace.SpanContextFromContext(produced); sc.IsValid() {
				opts = append(opts[:len(opts):len(opts)], trace.WithLinks(trace.Link{SpanContext: sc}))
			}
			if b := baggage.FromContext(produced); b.Len() > 0 {
				ctx = baggage.ContextWithBaggage(ctx, b)
			}
		}
	}
	n := len(p.attrs)
	p.attrs[n-2] = semconv.MessagingMessageID(eventID)
	p.attrs[n-1] = AttrAttempt.Int(c.Attempts)
	ctx, h.span = st.t.tracer.Start(ctx, st.name, opts...)
	p.attrs[n-2] = semconv.MessagingMessageID("") // drop the id's string
	k.starts.Put(p)
	return ctx
}

// handedOut records the commit-to-handler latency when the handler took
// the message.
func (h *handling) handedOut(ctx context.Context, created time.Time) {
	h.start = time.Now()
	if !created.IsZero() {
		h.st.t.latency.Record(ctx, max(h.start.Sub(created), 0).Seconds(), h.kind.latency...)
	}
}

// settled records the handler's duration and outcome.
func (h *handling) settled(ctx context.Context, acked bool) {
	d := time.Since(h.start).Seconds()
	if acked {
		// An acked span keeps the status Unset (OK): no attribute is set,
		// which would cost every handling an attribute merge.
		h.st.t.handlerTime.Record(ctx, d, h.kind.ack...)
	} else {
		h.st.t.handlerTime.Record(ctx, d, h.kind.nack...)
		h.span.SetAttributes(AttrOutcome.String("nack"))
		// The handler's error text may quote business data: not recorded.
		h.span.SetStatus(codes.Error, "nacked")
	}
}

// end ends the consumer span; outcome says why when the message was never
// settled ("released", "timeout"), "" otherwise.
func (h *handling) end(outcome string) {
	if outcome != "" {
		h.span.SetAttributes(AttrOutcome.String(outcome))
	}
	h.span.End()
}
