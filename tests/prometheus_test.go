package tests

import (
	"context"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/millpond/millpond/bus"
	"github.com/millpond/millpond/handlers"
	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/outbox/anydb"
)

// promMetrics are the outbox's metrics as the OpenTelemetry Prometheus
// exporter names them, with their Prometheus types.
var promMetrics = map[string]dto.MetricType{
	"millpond_events_enqueued_total":      dto.MetricType_COUNTER,
	"millpond_events_claimed_total":       dto.MetricType_COUNTER,
	"millpond_events_reclaimed_total":     dto.MetricType_COUNTER,
	"millpond_events_acknowledged_total":  dto.MetricType_COUNTER,
	"millpond_events_retried_total":       dto.MetricType_COUNTER,
	"millpond_events_dead_lettered_total": dto.MetricType_COUNTER,
	"millpond_held_batches_total":         dto.MetricType_COUNTER,
	"millpond_handler_duration_seconds":   dto.MetricType_HISTOGRAM,
	"millpond_delivery_latency_seconds":   dto.MetricType_HISTOGRAM,
	"millpond_claim_batch_size":           dto.MetricType_HISTOGRAM,
	"millpond_stats_duration_seconds":     dto.MetricType_HISTOGRAM,
	"millpond_backlog":                    dto.MetricType_GAUGE,
	"millpond_backlog_oldest_age_seconds": dto.MetricType_GAUGE,
	"millpond_dead_letters":               dto.MetricType_GAUGE,
	"millpond_blocked_events":             dto.MetricType_GAUGE,
	"millpond_held_keys":                  dto.MetricType_GAUGE,
}

// snapshotGauges are the metrics fed by the Stats snapshot.
var snapshotGauges = []string{"millpond_backlog", "millpond_backlog_oldest_age_seconds", "millpond_dead_letters", "millpond_blocked_events", "millpond_held_keys"}

func gather(t *testing.T, reg *prometheus.Registry) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Logf("gather: %v", err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

// What a Prometheus scrape of the OpenTelemetry exporter shows: every
// outbox metric under the name and type the README gives (and the README
// names no other), bounded labels only, the seconds histograms with
// millpond's bucket bounds; and, once the database is down, the readiness
// report says so while the snapshot gauges are absent from the scrape (not
// zero, not stale), as the README says: an alert on them needs an absent()
// companion.
func TestPrometheusScrape(t *testing.T) {
	db := testdb.New(t, "postgres")
	ctx := context.Background()
	reg, proxy, store := scrapedStoreBehindProxy(t, db, outbox.WithStatsInterval(100*time.Millisecond))
	const stream = "prom.orders"
	for _, g := range []string{"held", "flaky", "rc"} {
		if err := store.RegisterGroup(ctx, stream, g); err != nil {
			t.Fatal(err)
		}
	}
	tx, commit, rollback := db.Begin(t)
	for _, k := range []string{telKeyPrefix + "-1", telKeyPrefix + "-2"} {
		if _, err := store.Enqueue(ctx, tx, outbox.Event{Stream: stream, Key: k, Kind: "Placed", OrderingKey: telOrderingKey,
			Payload: []byte(`{"note":"` + telPayloadMark + `"}`)}); err != nil {
			rollback()
			t.Fatal(err)
		}
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}
	// Group rc: a claim whose lease lapses, for a reclaim.
	if cl, err := store.Claim(ctx, outbox.ClaimRequest{Stream: stream, Group: "rc", Worker: "w", Limit: 2, Lease: time.Second, MaxAttempts: 5}); err != nil || len(cl) != 1 {
		t.Fatalf("claim: %d, %v", len(cl), err)
	}
	db.Exec(t, "UPDATE millpond_deliveries SET available_at = available_at - 5000000 WHERE consumer_group = 'rc' AND status = 'processing'")

	consume := func(group string, cfg outbox.SubscriberConfig, ack bool, until func() bool) {
		t.Helper()
		cfg.ConsumerGroup, cfg.PollInterval = group, 20*time.Millisecond
		sub, err := outbox.NewSubscriber(store, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Close()
		msgs, err := sub.Subscribe(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(15 * time.Second)
		for !until() {
			select {
			case m := <-msgs:
				if ack {
					m.Ack()
				} else {
					m.Nack()
				}
			case <-time.After(50 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				t.Fatalf("group %s: not done in time", group)
			}
		}
	}
	count := func(group, status string) int64 {
		return db.Count(t, "SELECT COUNT(*) FROM millpond_outbox WHERE stream = '"+stream+"' AND consumer_group = '"+group+"' AND status = '"+status+"'")
	}
	consume("held", outbox.SubscriberConfig{HoldClaims: true, HoldClaimsAfter: -1}, true, func() bool { return count("held", "delivered") == 2 })
	consume("rc", outbox.SubscriberConfig{}, true, func() bool { return count("rc", "delivered") == 2 })
	consume("flaky", outbox.SubscriberConfig{MaxAttempts: 2, Backoff: func(int) time.Duration { return 0 }}, false,
		func() bool { return count("flaky", "dead_letter") == 1 })

	time.Sleep(150 * time.Millisecond) // a fresh snapshot
	mfs := gather(t, reg)
	bounded := []string{"messaging_system", "messaging_destination_name", "messaging_consumer_group_name", "millpond_event_kind", "millpond_outcome", "millpond_state"}
	for name, want := range promMetrics {
		mf, ok := mfs[name]
		if !ok {
			t.Errorf("the scrape has no %s", name)
			continue
		}
		if mf.GetType() != want {
			t.Errorf("%s is a %s, want a %s", name, mf.GetType(), want)
		}
	}
	for name, mf := range mfs {
		if !strings.HasPrefix(name, "millpond_") {
			continue
		}
		if _, ok := promMetrics[name]; !ok {
			t.Errorf("the scrape has %s, which this test (and so the README) does not know", name)
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if !slices.Contains(bounded, l.GetName()) {
					t.Errorf("%s has the label %s", name, l.GetName())
				}
				for _, secret := range []string{telKeyPrefix, telOrderingKey, telPayloadMark} {
					if strings.Contains(l.GetValue(), secret) {
						t.Errorf("%s{%s=%q} holds a key or payload", name, l.GetName(), l.GetValue())
					}
				}
			}
			if h := m.GetHistogram(); h != nil && strings.HasSuffix(name, "_seconds") {
				var bounds []float64
				for _, b := range h.GetBucket() {
					bounds = append(bounds, b.GetUpperBound())
				}
				if len(bounds) == 0 || bounds[0] != 0.0005 || bounds[len(bounds)-1] != 1800 {
					t.Errorf("%s buckets %v, want 0.0005 s … 1800 s", name, bounds)
				}
			}
		}
	}
	if v := gaugeValue(mfs, "millpond_dead_letters", "flaky"); v != 1 {
		t.Errorf("millpond_dead_letters{group=flaky} = %v, want 1", v)
	}

	// The README names every one of them, and no other outbox metric.
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for name := range promMetrics {
		if !strings.Contains(string(readme), name) {
			t.Errorf("README does not name %s", name)
		}
	}
	section, _, _ := strings.Cut(string(readme[strings.Index(string(readme), "## Metrics, traces and readiness"):]), "\n## Relay")
	for _, name := range regexp.MustCompile(`millpond_[a-z_]*[a-z]`).FindAllString(section, -1) {
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_count"), "_sum")
		if slices.Contains(bounded, name) { // a label
			continue
		}
		if _, ok := promMetrics[base]; !ok {
			t.Errorf("README's metrics section names %s, which the scrape does not have", name)
		}
	}

	// The database goes down.
	h := handlers.New("prom-h", stream, "Placed", func(context.Context, telOrder, handlers.Meta) error { return nil })
	b, err := bus.New(store, bus.Config{Subscriber: outbox.SubscriberConfig{PollInterval: 20 * time.Millisecond}}, h)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer b.Stop(context.Background())
	queriesBefore := mfs["millpond_stats_duration_seconds"].GetMetric()[0].GetHistogram().GetSampleCount()
	proxy.close()
	time.Sleep(150 * time.Millisecond)
	code, rep, body := readyz(t, b.ReadinessHandler(bus.HealthOptions{}))
	if code != http.StatusServiceUnavailable || rep.Database != "unreachable" || rep.StatsAt != nil {
		t.Errorf("readiness with the database down: %d %s", code, body)
	}
	mfs = gather(t, reg)
	for _, name := range snapshotGauges {
		if _, ok := mfs[name]; ok {
			t.Errorf("%s is still in the scrape with the database down; the README says it is absent", name)
		}
	}
	if _, ok := mfs["millpond_events_claimed_total"]; !ok {
		t.Error("the counters left the scrape with the database down")
	}
	if n := mfs["millpond_stats_duration_seconds"].GetMetric()[0].GetHistogram().GetSampleCount(); n <= queriesBefore {
		t.Errorf("stats queries %d, then %d: the failed one is not counted", queriesBefore, n)
	}
}

func gaugeValue(mfs map[string]*dto.MetricFamily, name, group string) float64 {
	for _, m := range mfs[name].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "messaging_consumer_group_name" && l.GetValue() == group {
				return m.GetGauge().GetValue()
			}
		}
	}
	return -1
}

// A database that hangs (the network drops its packets; nothing is
// refused) must not hang the scrape: the Prometheus exporter collects with
// a context that has no deadline, and the Stats query behind the gauges
// would wait on the frozen connection for as long as the kernel keeps it,
// holding the SDK's collection (every other metric of the process with
// it) and the stats cache, so that the readiness probe hung too. The
// gauges' query is bounded when the collection's context has no deadline,
// and the readiness report's by HealthOptions.PingTimeout.
func TestScrapeAndReadinessWhileTheDatabaseHangs(t *testing.T) {
	db := testdb.New(t, "postgres")
	ctx := context.Background()
	reg, proxy, store := scrapedStoreBehindProxy(t, db, outbox.WithStatsInterval(50*time.Millisecond), outbox.WithoutListen())
	h := handlers.New("hang-h", "hang", "K", func(context.Context, telOrder, handlers.Meta) error { return nil })
	b, err := bus.New(store, bus.Config{Subscriber: outbox.SubscriberConfig{PollInterval: 20 * time.Millisecond}}, h)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.RegisterGroups(ctx); err != nil {
		t.Fatal(err)
	}
	tx, commit, _ := db.Begin(t)
	if _, err := store.Enqueue(ctx, tx, outbox.Event{Stream: "hang", Key: "k", Kind: "K", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}
	if _, ok := gather(t, reg)["millpond_backlog"]; !ok {
		t.Fatal("no backlog gauge before the freeze")
	}
	time.Sleep(100 * time.Millisecond) // the snapshot is stale
	proxy.freeze()

	scraped := make(chan map[string]*dto.MetricFamily, 1)
	start := time.Now()
	go func() { scraped <- gather(t, reg) }()
	select {
	case mfs := <-scraped:
		if _, ok := mfs["millpond_backlog"]; ok {
			t.Error("the backlog gauge is in the scrape while the database hangs")
		}
		if _, ok := mfs["millpond_stats_duration_seconds"]; !ok {
			t.Error("the scrape lost the other metrics")
		}
		t.Logf("scrape answered after %v", time.Since(start).Round(time.Millisecond))
	case <-time.After(15 * time.Second):
		t.Fatal("the scrape still hangs after 15 s with the database frozen")
	}

	type result struct {
		code int
		rep  bus.Health
	}
	ready := make(chan result, 1)
	start = time.Now()
	go func() {
		code, rep, _ := readyz(t, b.ReadinessHandler(bus.HealthOptions{PingTimeout: 500 * time.Millisecond}))
		ready <- result{code, rep}
	}()
	select {
	case r := <-ready:
		if r.code != http.StatusServiceUnavailable || r.rep.Database != "unreachable" {
			t.Errorf("readiness while the database hangs: %d %+v", r.code, r.rep)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("readiness took %v with a ping timeout of 500ms", d)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the readiness probe still hangs after 15 s with the database frozen")
	}
}

// scrapedStoreBehindProxy opens a migrated store over db that reaches it
// through a freezeProxy (unfrozen at cleanup, before the store closes) and
// reports its metrics to a Prometheus registry through the OpenTelemetry
// exporter.
func scrapedStoreBehindProxy(t *testing.T, db *testdb.Database, opts ...outbox.Option) (*prometheus.Registry, *freezeProxy, *outbox.Store) {
	t.Helper()
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	t.Cleanup(func() { _ = mp.Shutdown(ctx) })
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newFreezeProxy(t, u.Host)
	store, err := anydb.Open(ctx, proxy.via(t, db.URL), append([]outbox.Option{outbox.WithMeterProvider(mp)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups run last in, first out: the proxy thaws, then the store
	// closes, then the meter provider shuts down.
	t.Cleanup(func() { proxy.unfreeze(); _ = store.Close() })
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return reg, proxy, store
}
