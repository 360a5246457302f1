package outbox

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// BenchmarkConsumerSpan measures one handling's telemetry with the
// OpenTelemetry SDK installed (every span sampled, batched to a discarding
// exporter): the consumer span from the metadata's trace context, the
// latency and duration records, the span's end.
func BenchmarkConsumerSpan(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	o := buildOptions([]Option{WithTracerProvider(tp), WithPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))})
	tel, _ := newTelemetry(o)
	st := tel.forSubscription("s", "g")
	md := map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	c := Claimed{ID: 1, Kind: "K", Metadata: md, CreatedAt: time.Now()}
	b.ReportAllocs()
	for b.Loop() {
		var h handling
		ctx := st.startProcess(context.Background(), c, "1", &h)
		h.handedOut(ctx, c.CreatedAt)
		h.settled(ctx, true)
		h.end("")
	}
}

// A claim's events are counted per kind, reclaims apart, whatever order
// the kinds come in.
func TestClaimedCountsPerKind(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	tel, err := newTelemetry(buildOptions([]Option{WithMeterProvider(mp)}))
	if err != nil {
		t.Fatal(err)
	}
	st := tel.forSubscription("s", "g")
	st.claimed(context.Background(), []Claimed{
		{ID: 1, Kind: "A"}, {ID: 2, Kind: "B"}, {ID: 3, Kind: "A", Reclaimed: true},
		{ID: 4, Kind: "C", Reclaimed: true}, {ID: 5, Kind: "B"}, {ID: 6, Kind: "A"},
	})
	st.claimed(context.Background(), []Claimed{{ID: 7, Kind: "B"}})
	st.claimed(context.Background(), nil)
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]map[string]int64{}
	batches := uint64(0)
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					kind, _ := p.Attributes.Value(AttrEventKind)
					if got[m.Name] == nil {
						got[m.Name] = map[string]int64{}
					}
					got[m.Name][kind.AsString()] += p.Value
				}
			case metricdata.Histogram[int64]:
				for _, p := range d.DataPoints {
					batches += p.Count
				}
			}
		}
	}
	want := map[string]map[string]int64{
		"millpond.events.claimed":   {"A": 3, "B": 3, "C": 1},
		"millpond.events.reclaimed": {"A": 1, "C": 1},
	}
	for name, kinds := range want {
		for kind, n := range kinds {
			if got[name][kind] != n {
				t.Errorf("%s{kind=%s} = %d, want %d", name, kind, got[name][kind], n)
			}
		}
		if len(got[name]) != len(kinds) {
			t.Errorf("%s has kinds %v, want %v", name, got[name], kinds)
		}
	}
	if batches != 2 {
		t.Errorf("%d claim batch sizes recorded, want 2 (an empty claim is not recorded)", batches)
	}
}

// Consumer spans started one after another, and from several goroutines at
// once, each carry their own message id and attempt (the start options are
// reused), the producer's span context as their parent, or as a link when
// the context already has a span, and the producer's baggage.
func TestConsumerSpanAttributesAndParent(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	w3c := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	tel, err := newTelemetry(buildOptions([]Option{WithTracerProvider(tp), WithPropagator(w3c)}))
	if err != nil {
		t.Fatal(err)
	}
	st := tel.forSubscription("s", "g")
	producer := "0af7651916cd43dd8448eb211c80319c"
	md := map[string]string{"traceparent": "00-" + producer + "-b7ad6b7169203331-01", "baggage": "tenant=acme"}

	const n = 200
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := w; i < n; i += 4 {
				var h handling
				ctx := st.startProcess(context.Background(), Claimed{ID: int64(1000 + i), Kind: []string{"A", "B"}[i%2], Attempts: 1 + i%3, Metadata: md}, strconv.Itoa(1000+i), &h)
				if v := baggage.FromContext(ctx).Member("tenant").Value(); v != "acme" {
					t.Errorf("baggage tenant = %q", v)
				}
				h.end("")
			}
		})
	}
	wg.Wait()
	// A Subscribe context with a span of its own stays the parent; the
	// producer's span is linked.
	own, span := tp.Tracer("test").Start(context.Background(), "subscribe")
	var h handling
	st.startProcess(own, Claimed{ID: 5000, Kind: "A", Attempts: 2, Metadata: md}, "5000", &h)
	h.end("")
	span.End()

	seen := map[string]bool{}
	for _, s := range rec.Ended() {
		if s.SpanKind() != trace.SpanKindConsumer {
			continue
		}
		attrs := attribute.NewSet(s.Attributes()...)
		id, _ := attrs.Value(semconv.MessagingMessageIDKey)
		attempt, _ := attrs.Value(AttrAttempt)
		kind, _ := attrs.Value(AttrEventKind)
		i, err := strconv.Atoi(id.AsString())
		if err != nil || seen[id.AsString()] {
			t.Fatalf("span with message id %q (seen before: %v)", id.AsString(), seen[id.AsString()])
		}
		seen[id.AsString()] = true
		if i == 5000 {
			if s.Parent().SpanID() != span.SpanContext().SpanID() || len(s.Links()) != 1 || s.Links()[0].SpanContext.TraceID().String() != producer {
				t.Errorf("span of a context with a span: parent %v, links %v; want that span, and a link to the producer", s.Parent(), s.Links())
			}
			continue
		}
		i -= 1000
		if attempt.AsInt64() != int64(1+i%3) || kind.AsString() != []string{"A", "B"}[i%2] {
			t.Errorf("span of message %d: attempt %d kind %s, want %d %s", 1000+i, attempt.AsInt64(), kind.AsString(), 1+i%3, []string{"A", "B"}[i%2])
		}
		if s.Parent().TraceID().String() != producer || !s.Parent().IsRemote() || len(s.Links()) != 0 {
			t.Errorf("span of message %d: parent %v, %d links; want the producer's span as remote parent", 1000+i, s.Parent(), len(s.Links()))
		}
		if len(s.Attributes()) != 8 {
			t.Errorf("span of message %d has %d attributes, want 8", 1000+i, len(s.Attributes()))
		}
	}
	if len(seen) != n+1 {
		t.Errorf("%d consumer spans, want %d", len(seen), n+1)
	}
}
