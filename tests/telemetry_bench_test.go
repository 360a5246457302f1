package tests

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/millpond/millpond/bus"
	"github.com/millpond/millpond/handlers"
	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// discardMetrics is a metric exporter that drops what it is given: the
// SDK aggregates and collects as it would for a real exporter.
type discardMetrics struct{}

func (discardMetrics) Temporality(k sdkmetric.InstrumentKind) metricdata.Temporality {
	return sdkmetric.DefaultTemporalitySelector(k)
}
func (discardMetrics) Aggregation(k sdkmetric.InstrumentKind) sdkmetric.Aggregation {
	return sdkmetric.DefaultAggregationSelector(k)
}
func (discardMetrics) Export(context.Context, *metricdata.ResourceMetrics) error { return nil }
func (discardMetrics) ForceFlush(context.Context) error                          { return nil }
func (discardMetrics) Shutdown(context.Context) error                            { return nil }

// telemetryRound enqueues n events, then times their delivery through a
// bus (one handler, batch 100, 8 in flight) over store.
func telemetryRound(tb testing.TB, db *testdb.Database, store *outbox.Store, stream string, n int) (enqueue, deliver time.Duration) {
	tb.Helper()
	ctx := context.Background()
	var handled atomic.Int64
	done := make(chan struct{})
	h := handlers.New("bench-h", stream, "K", func(context.Context, telOrder, handlers.Meta) error {
		if handled.Add(1) == int64(n) {
			close(done)
		}
		return nil
	})
	b, err := bus.New(store, bus.Config{Unrouted: bus.UnroutedKeep, Subscriber: outbox.SubscriberConfig{BatchSize: 100, MaxInFlight: 8}}, h)
	if err != nil {
		tb.Fatal(err)
	}
	if err := b.RegisterGroups(ctx); err != nil {
		tb.Fatal(err)
	}
	start := time.Now()
	for i := 0; i < n; i += 100 {
		tx, commit, rollback := db.Begin(tb)
		for j := i; j < min(i+100, n); j++ {
			if _, err := store.Enqueue(ctx, tx, outbox.Event{Stream: stream, Key: strconv.Itoa(j), Kind: "K", Payload: []byte(`{"n":1}`)}); err != nil {
				rollback()
				tb.Fatal(err)
			}
		}
		if err := commit(); err != nil {
			tb.Fatal(err)
		}
	}
	enqueue = time.Since(start)
	start = time.Now()
	if err := b.Start(ctx); err != nil {
		tb.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		tb.Fatalf("delivered %d of %d", handled.Load(), n)
	}
	deliver = time.Since(start)
	if err := b.Stop(ctx); err != nil {
		tb.Fatal(err)
	}
	return enqueue, deliver
}

// BenchmarkTelemetryOverhead delivers the same workload with telemetry
// off (no-op providers) and on (the OpenTelemetry SDK installed: every
// span sampled and batched to a discarding exporter, metrics aggregated and
// collected every 100 ms by a periodic reader with a discarding exporter),
// interleaved, b.N pairs of rounds, and reports the on/off throughput
// ratios of delivery and enqueue (median of the pairs);
// MILLPOND_TELEMETRY_BENCH_ON=metrics or traces turns on only one of them.
// Run it with
//
//	MILLPOND_TELEMETRY_BENCH_EVENTS=2000 go test -run '^$' -bench TelemetryOverhead -benchtime 5x ./tests/
func BenchmarkTelemetryOverhead(b *testing.B) {
	n := 2000
	if v, err := strconv.Atoi(os.Getenv("MILLPOND_TELEMETRY_BENCH_EVENTS")); err == nil && v > 0 {
		n = v
	}
	dialect := os.Getenv("MILLPOND_TELEMETRY_BENCH_DIALECT")
	if dialect == "" {
		dialect = "postgres"
	}
	db := testdb.New(b, dialect)
	off := db.Store(b, outbox.WithMeterProvider(metricnoop.NewMeterProvider()), outbox.WithTracerProvider(tracenoop.NewTracerProvider()))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewPeriodicReader(discardMetrics{}, sdkmetric.WithInterval(100*time.Millisecond))))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	b.Cleanup(func() {
		_ = mp.Shutdown(context.Background())
		_ = tp.Shutdown(context.Background())
	})
	onOpts := []outbox.Option{outbox.WithMeterProvider(mp), outbox.WithTracerProvider(tp), outbox.WithPropagator(w3c), outbox.WithStatsInterval(time.Second)}
	switch os.Getenv("MILLPOND_TELEMETRY_BENCH_ON") { // to tell the costs apart
	case "metrics":
		onOpts = append(onOpts, outbox.WithTracerProvider(tracenoop.NewTracerProvider()))
	case "traces":
		onOpts = append(onOpts, outbox.WithMeterProvider(metricnoop.NewMeterProvider()))
	case "spans": // traces without the trace context in the metadata
		onOpts = append(onOpts, outbox.WithMeterProvider(metricnoop.NewMeterProvider()), outbox.WithPropagator(propagation.NewCompositeTextMapPropagator()))
	}
	on := db.Store(b, onOpts...)
	var deliverRatios, enqueueRatios []float64
	var offDeliver, onDeliver time.Duration
	b.ResetTimer()
	for i := range b.N {
		var eOff, dOff, eOn, dOn time.Duration
		if i%2 == 0 { // alternate which goes first
			eOff, dOff = telemetryRound(b, db, off, fmt.Sprint("off", i), n)
			eOn, dOn = telemetryRound(b, db, on, fmt.Sprint("on", i), n)
		} else {
			eOn, dOn = telemetryRound(b, db, on, fmt.Sprint("on", i), n)
			eOff, dOff = telemetryRound(b, db, off, fmt.Sprint("off", i), n)
		}
		offDeliver += dOff
		onDeliver += dOn
		deliverRatios = append(deliverRatios, dOff.Seconds()/dOn.Seconds())
		enqueueRatios = append(enqueueRatios, eOff.Seconds()/eOn.Seconds())
	}
	b.StopTimer()
	median := func(xs []float64) float64 {
		slices.Sort(xs)
		return xs[len(xs)/2]
	}
	b.ReportMetric(median(deliverRatios), "deliver-on/off")
	b.ReportMetric(median(enqueueRatios), "enqueue-on/off")
	b.ReportMetric(float64(n*b.N)/offDeliver.Seconds(), "off-events/s")
	b.ReportMetric(float64(n*b.N)/onDeliver.Seconds(), "on-events/s")
}
