package outbox

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
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
		ctx, h := st.startProcess(context.Background(), c)
		h.handedOut(ctx, c.CreatedAt)
		h.settled(ctx, true)
		h.end("")
	}
}
