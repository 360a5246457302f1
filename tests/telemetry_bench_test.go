package tests

import (
	"context"
	"fmt"
	"os"
	"runtime"
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
	"go.opentelemetry.io/otel/trace"
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
// bus (one handler, batch 100, 8 in flight) over store; cpu is the CPU time
// this process used during the delivery (0 where it is not measured).
// Between the two phases a garbage collection runs and flush, if not nil,
// is called, so that the delivery does not pay for the enqueue's garbage
// or spans.
func telemetryRound(tb testing.TB, db *testdb.Database, store *outbox.Store, stream string, n int, flush func()) (enqueue, deliver, cpu time.Duration) {
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
	if flush != nil {
		flush()
	}
	runtime.GC()
	cpuStart := processCPU()
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
	cpu = processCPU() - cpuStart
	if err := b.Stop(ctx); err != nil {
		tb.Fatal(err)
	}
	return enqueue, deliver, cpu
}

// countingSpans is a span exporter that counts the consumer spans it is
// given and drops them.
type countingSpans struct{ consumer atomic.Int64 }

func (c *countingSpans) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	for _, s := range spans {
		if s.SpanKind() == trace.SpanKindConsumer {
			c.consumer.Add(1)
		}
	}
	return nil
}
func (c *countingSpans) Shutdown(context.Context) error { return nil }

// BenchmarkTelemetryOverhead delivers the same workload with telemetry
// off (no-op providers) and on (the OpenTelemetry SDK installed: every
// span sampled and batched to an exporter that drops it, metrics
// aggregated and collected every 100 ms by a periodic reader with a
// discarding exporter), and reports the on/off throughput ratios of
// delivery and enqueue. The machine it runs on is shared and noisy, so a
// round of each runs first unmeasured (pools, caches), then b.N pairs of
// rounds, interleaved (which goes first alternates), each round with its
// own stream; in every round, on or off, a garbage collection runs between
// the enqueue and the delivery, and in the on rounds the spans of the
// enqueue are exported first, so that the delivery is not charged for the
// enqueue's telemetry; it reports the median of the pairs' ratios and the ratio of
// the summed times, and the median ratio of the CPU time the process used
// to deliver (on over off: what telemetry costs the client, which the
// throughput shows only when the client, not the database, is the limit). It fails when the on rounds did not record what they
// handled (one consumer span and one acknowledgement per event): a
// measurement of telemetry that was not on would be no measurement.
// MILLPOND_TELEMETRY_BENCH_ON=metrics or traces turns on only one of them.
// Run it with
//
//	MILLPOND_TELEMETRY_BENCH_EVENTS=3000 go test -run '^$' -bench TelemetryOverhead -benchtime 8x ./tests/
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
	reader := sdkmetric.NewManualReader() // read at the end, for the check
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewPeriodicReader(discardMetrics{}, sdkmetric.WithInterval(100*time.Millisecond))), sdkmetric.WithReader(reader))
	spans := &countingSpans{}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(spans))
	b.Cleanup(func() {
		_ = mp.Shutdown(context.Background())
		_ = tp.Shutdown(context.Background())
	})
	onOpts := []outbox.Option{outbox.WithMeterProvider(mp), outbox.WithTracerProvider(tp), outbox.WithPropagator(w3c), outbox.WithStatsInterval(time.Second)}
	traces, metrics := true, true
	switch os.Getenv("MILLPOND_TELEMETRY_BENCH_ON") { // to tell the costs apart
	case "metrics":
		onOpts, traces = append(onOpts, outbox.WithTracerProvider(tracenoop.NewTracerProvider())), false
	case "traces":
		onOpts, metrics = append(onOpts, outbox.WithMeterProvider(metricnoop.NewMeterProvider())), false
	case "spans": // traces without the trace context in the metadata
		onOpts, metrics = append(onOpts, outbox.WithMeterProvider(metricnoop.NewMeterProvider()), outbox.WithPropagator(propagation.NewCompositeTextMapPropagator())), false
	}
	on := db.Store(b, onOpts...)
	flush := func() {
		if err := tp.ForceFlush(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	telemetryRound(b, db, off, "warm-off", n, nil)
	telemetryRound(b, db, on, "warm-on", n, flush)
	var deliverRatios, enqueueRatios, cpuRatios []float64
	var offDeliver, onDeliver time.Duration
	b.ResetTimer()
	for i := range b.N {
		var eOff, dOff, cOff, eOn, dOn, cOn time.Duration
		if i%2 == 0 { // alternate which goes first
			eOff, dOff, cOff = telemetryRound(b, db, off, fmt.Sprint("off", i), n, nil)
			eOn, dOn, cOn = telemetryRound(b, db, on, fmt.Sprint("on", i), n, flush)
		} else {
			eOn, dOn, cOn = telemetryRound(b, db, on, fmt.Sprint("on", i), n, flush)
			eOff, dOff, cOff = telemetryRound(b, db, off, fmt.Sprint("off", i), n, nil)
		}
		offDeliver += dOff
		onDeliver += dOn
		deliverRatios = append(deliverRatios, dOff.Seconds()/dOn.Seconds())
		enqueueRatios = append(enqueueRatios, eOff.Seconds()/eOn.Seconds())
		if cOff > 0 && cOn > 0 {
			cpuRatios = append(cpuRatios, cOn.Seconds()/cOff.Seconds())
		}
	}
	b.StopTimer()

	// Everything the on rounds handled was recorded.
	handled := int64(n * (b.N + 1))
	if traces {
		if err := tp.ForceFlush(context.Background()); err != nil {
			b.Fatal(err)
		}
		if got := spans.consumer.Load(); got < handled {
			b.Fatalf("%d consumer spans exported, want one per handled event (%d)", got, handled)
		}
	}
	if metrics {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			b.Fatal(err)
		}
		var acked int64
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "millpond.events.acknowledged" {
					for _, p := range sum.DataPoints {
						acked += p.Value
					}
				}
			}
		}
		if acked != handled {
			b.Fatalf("millpond.events.acknowledged = %d, want the %d events handled with telemetry on", acked, handled)
		}
	}

	median := func(xs []float64) float64 {
		slices.Sort(xs)
		if len(xs)%2 == 0 {
			return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
		}
		return xs[len(xs)/2]
	}
	b.ReportMetric(median(deliverRatios), "deliver-on/off")
	b.ReportMetric(offDeliver.Seconds()/onDeliver.Seconds(), "deliver-total-on/off")
	b.ReportMetric(median(enqueueRatios), "enqueue-on/off")
	if len(cpuRatios) > 0 {
		// The client's own CPU per delivery, on over off (higher is more
		// expensive): unlike the throughput it hardly depends on how busy
		// the database and the machine are.
		b.ReportMetric(median(cpuRatios), "deliver-cpu-on/off")
	}
	b.ReportMetric(float64(n*b.N)/offDeliver.Seconds(), "off-events/s")
	b.ReportMetric(float64(n*b.N)/onDeliver.Seconds(), "on-events/s")
}
