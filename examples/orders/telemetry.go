package main

import (
	"context"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	"go.uber.org/fx"
)

// metricsHandler serves the service's metrics in the Prometheus text
// format at /metrics.
type metricsHandler struct{ http.Handler }

// telemetryResult is what newTelemetry adds to the fx graph: the
// MeterProvider and propagator that fxmodule hands to the outbox store, and
// the /metrics handler.
type telemetryResult struct {
	fx.Out
	MeterProvider metric.MeterProvider
	Propagator    propagation.TextMapPropagator
	Metrics       *metricsHandler
}

// newTelemetry builds an OpenTelemetry MeterProvider whose reader is the
// OpenTelemetry Prometheus exporter over a registry of the service's own,
// served at /metrics: millpond's instruments appear as millpond_… series.
// A TracerProvider with the application's exporter would be provided the
// same way (as trace.TracerProvider) to trace handlings; the W3C
// propagator is in the graph so that events carry the trace context once
// one is.
func newTelemetry(lc fx.Lifecycle) (telemetryResult, error) {
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		return telemetryResult{}, fmt.Errorf("orders: prometheus exporter: %w", err)
	}
	mp := sdkmetric.NewMeterProvider(
		sdkmetric.WithReader(exporter),
		sdkmetric.WithResource(resource.NewSchemaless(attribute.String("service.name", "orders"))),
	)
	lc.Append(fx.StopHook(func(ctx context.Context) error { return mp.Shutdown(ctx) }))
	return telemetryResult{
		MeterProvider: mp,
		Propagator:    propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
		Metrics:       &metricsHandler{promhttp.HandlerFor(reg, promhttp.HandlerOpts{})},
	}, nil
}
