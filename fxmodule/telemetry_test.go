package fxmodule_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"
	"go.uber.org/zap"

	"github.com/millpond/millpond/bus"
	"github.com/millpond/millpond/fxmodule"
	"github.com/millpond/millpond/outbox"
)

// The module takes the MeterProvider, TracerProvider and propagator from
// the application's graph and provides the readiness handler.
func TestModuleTakesTelemetryFromTheGraphAndProvidesReadiness(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	c := &counters{}
	var store *outbox.Store
	var pub *outbox.Publisher
	var ready *bus.ReadinessHandler
	app := fxtest.New(t,
		fx.Supply(zap.NewNop(), c),
		fx.Supply(fx.Annotate(mp, fx.As(new(metric.MeterProvider)))),
		fx.Supply(fx.Annotate(tp, fx.As(new(trace.TracerProvider)))),
		fx.Supply(fx.Annotate(propagation.TraceContext{}, fx.As(new(propagation.TextMapPropagator)))),
		fx.Supply(fxmodule.Config{
			DatabaseURL: "sqlite:" + filepath.Join(t.TempDir(), "app.db"),
			AutoMigrate: true,
			Bus:         bus.Config{Subscriber: outbox.SubscriberConfig{PollInterval: 10 * time.Millisecond}},
		}),
		fxmodule.Module,
		fx.Provide(fxmodule.AsHandler(newReserve), fxmodule.AsHandler(newNotify)),
		fx.Populate(&store, &pub, &ready),
	)
	app.RequireStart()
	defer app.RequireStop()

	rec := httptest.NewRecorder()
	ready.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("readyz: %d %s", rec.Code, rec.Body)
	}

	ctx, span := tp.Tracer("test").Start(context.Background(), "request")
	tx, err := store.SQLDB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":1}`))
	msg.Metadata.Set(outbox.MetadataKind, "OrderPlaced")
	msg.SetContext(outbox.ContextWithTx(ctx, outbox.SQLTx(tx)))
	if err := pub.Publish("orders", msg); err != nil {
		t.Fatal(err)
	}
	if msg.Metadata.Get("traceparent") != "" {
		t.Error("Publish changed the caller's message metadata")
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	span.End()
	deadline := time.Now().Add(10 * time.Second)
	for c.reserve.Load() < 1 || c.notify.Load() < 1 {
		if time.Now().After(deadline) {
			t.Fatal("not handled")
		}
		time.Sleep(10 * time.Millisecond)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			names[m.Name] = true
		}
	}
	for _, want := range []string{"millpond.events.enqueued", "millpond.events.claimed", "millpond.backlog", "millpond.backlog.oldest_age"} {
		if !names[want] {
			t.Errorf("the graph's MeterProvider has no %s (has %v)", want, names)
		}
	}
	consumers := 0
	for consumers < 2 && time.Now().Before(deadline) {
		consumers = 0
		for _, s := range spans.Ended() {
			if s.SpanKind() == trace.SpanKindConsumer {
				consumers++
				if s.SpanContext().TraceID() != span.SpanContext().TraceID() {
					t.Fatalf("consumer span outside the request's trace")
				}
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if consumers != 2 {
		t.Errorf("%d consumer spans on the graph's TracerProvider, want 2 (one per handler)", consumers)
	}
}
