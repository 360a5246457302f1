package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/millpond/millpond/bus"
)

// The service's /metrics is Prometheus text (parsed with expfmt) holding
// the backlog and oldest-age series of the orders stream for every
// handler's and group's consumer group, names prefixed millpond_, with no
// order id in any label; /readyz answers 200 with the health report, the
// groups' subscribers counted in (notify, reserve-stock, read-model and the
// bus's unrouted events).
func TestMetricsAndReadyz(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	cfg := config{Addr: addr, DatabaseURL: "sqlite:" + filepath.Join(t.TempDir(), "orders.db"), Lease: 30 * time.Second, StatsInterval: 50 * time.Millisecond}
	app := newApp(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := app.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = app.Stop(context.Background()) }()
	base := "http://" + addr

	res, err := http.Post(base+"/orders", "application/json", strings.NewReader(`{"customer":"ada","sku":"widget","qty":2}`))
	if err != nil {
		t.Fatal(err)
	}
	var placed map[string]string
	_ = json.NewDecoder(res.Body).Decode(&placed)
	res.Body.Close()
	if res.StatusCode != http.StatusCreated || placed["id"] == "" {
		t.Fatalf("place order: %d %v", res.StatusCode, placed)
	}

	groups := []string{"reserve-stock", "notify", "read-model"}
	var families map[string]*dto.MetricFamily
	var text string
	deadline := time.Now().Add(15 * time.Second)
	for {
		res, err := http.Get(base + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		text = string(body)
		parser := expfmt.NewTextParser(model.UTF8Validation)
		families, err = parser.TextToMetricFamilies(strings.NewReader(text))
		if err != nil {
			t.Fatalf("/metrics is not Prometheus text: %v\n%s", err, text)
		}
		if acked := sumSeries(families["millpond_events_acknowledged_total"], nil); acked >= 4 {
			break // placed, reserved (or rejected), notified: every handler ran
		}
		if time.Now().After(deadline) {
			t.Fatalf("handlers never acknowledged:\n%s", text)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, name := range []string{"millpond_backlog", "millpond_backlog_oldest_age_seconds"} {
		f := families[name]
		if f == nil || f.GetType() != dto.MetricType_GAUGE {
			t.Fatalf("no gauge %s in /metrics", name)
		}
		for _, g := range groups {
			if !hasSeries(f, map[string]string{"messaging_destination_name": Stream, "messaging_consumer_group_name": g}) {
				t.Errorf("%s has no series for stream %s, group %s", name, Stream, g)
			}
		}
	}
	for _, state := range []string{"pending", "retrying", "processing", "blocked", "dead"} {
		if !hasSeries(families["millpond_backlog"], map[string]string{"messaging_consumer_group_name": "notify", "millpond_state": state}) {
			t.Errorf("millpond_backlog has no %s series", state)
		}
	}
	for _, name := range []string{"millpond_events_enqueued_total", "millpond_events_claimed_total", "millpond_handler_duration_seconds", "millpond_delivery_latency_seconds"} {
		if families[name] == nil {
			t.Errorf("no %s in /metrics", name)
		}
	}
	if strings.Contains(text, placed["id"]) {
		t.Errorf("/metrics shows the order id %s", placed["id"])
	}

	res, err = http.Get(base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	var report bus.Health
	_ = json.NewDecoder(res.Body).Decode(&report)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || !report.Ready || report.Subscribers != 4 {
		t.Errorf("/readyz: %d %+v", res.StatusCode, report)
	}
}

func hasSeries(f *dto.MetricFamily, labels map[string]string) bool {
	if f == nil {
		return false
	}
	for _, m := range f.GetMetric() {
		if matches(m, labels) {
			return true
		}
	}
	return false
}

func matches(m *dto.Metric, labels map[string]string) bool {
	have := map[string]string{}
	for _, l := range m.GetLabel() {
		have[l.GetName()] = l.GetValue()
	}
	for k, v := range labels {
		if have[k] != v {
			return false
		}
	}
	return true
}

func sumSeries(f *dto.MetricFamily, labels map[string]string) float64 {
	total := 0.0
	if f == nil {
		return 0
	}
	for _, m := range f.GetMetric() {
		if matches(m, labels) {
			total += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return total
}
