package relay_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/internal/testnats"
	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/relay"
)

// metrics is one collection of a ManualReader.
type metrics struct {
	t  *testing.T
	rm metricdata.ResourceMetrics
}

func collect(t *testing.T, reader *sdkmetric.ManualReader) metrics {
	t.Helper()
	m := metrics{t: t}
	if err := reader.Collect(context.Background(), &m.rm); err != nil {
		t.Fatal(err)
	}
	return m
}

// allowed are the only attribute keys a relay metric may carry: bounded
// ones, never keys, ids or subjects.
var allowed = map[attribute.Key]bool{
	"messaging.system": true, "messaging.destination.name": true, "messaging.consumer.group.name": true,
	relay.AttrTarget: true, relay.AttrReason: true, outbox.AttrOutcome: true,
}

// points returns the data points of the named metric (scope relay) whose
// attributes include want, as value and count (histograms) pairs.
func (m metrics) points(name string, want ...attribute.KeyValue) (sum int64, count uint64, found bool) {
	m.t.Helper()
	match := func(set attribute.Set) bool {
		for it := set.Iter(); it.Next(); {
			if kv := it.Attribute(); !allowed[kv.Key] {
				m.t.Errorf("metric %s carries attribute %s", name, kv.Key)
			}
		}
		for _, kv := range want {
			if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
				return false
			}
		}
		return true
	}
	for _, sm := range m.rm.ScopeMetrics {
		if sm.Scope.Name != relay.InstrumentationName {
			continue
		}
		for _, md := range sm.Metrics {
			if md.Name != name {
				continue
			}
			found = true
			switch d := md.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					if match(p.Attributes) {
						sum += p.Value
					}
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					if match(p.Attributes) {
						sum += p.Value
						count++
					}
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					if match(p.Attributes) {
						count += p.Count
					}
				}
			default:
				m.t.Fatalf("metric %s: unexpected data %T", name, md.Data)
			}
		}
	}
	return sum, count, found
}

func (m metrics) counter(name string, want ...attribute.KeyValue) int64 {
	m.t.Helper()
	n, _, _ := m.points(name, want...)
	return n
}

// TestJetStreamMetrics relays 40 events, 3 of which JetStream already has
// (duplicates) and 1 that can never be published (dead-lettered at once),
// and checks every counter exactly, the latency histograms' counts and the
// in-flight gauge.
func TestJetStreamMetrics(t *testing.T) {
	store, db, nc, js, st, prefix := setup(t, 2*time.Minute)
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(ctx) }()
	if err := store.RegisterGroup(ctx, "s", relay.DefaultGroup); err != nil {
		t.Fatal(err)
	}
	var evs []outbox.Event
	for i := range 40 {
		ev := outbox.Event{Stream: "s", Key: fmt.Sprintf("k.%d", i), Kind: "K", Payload: fmt.Appendf(nil, "%d", i)}
		if i%4 == 0 {
			ev.OrderingKey = fmt.Sprintf("o%d", i%3)
		}
		if i == 17 {
			ev.Metadata = map[string]string{"Nats-Expected-Stream": "elsewhere"} // reserved: unpublishable
		}
		evs = append(evs, ev)
	}
	enqueue(t, db, store, evs...)
	for _, i := range []int{3, 9, 21} { // already in the stream: duplicates
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: prefix + ".s.K", Data: fmt.Appendf(nil, "%d", i),
			Header: nats.Header{jetstream.MsgIDHeader: []string{relay.MsgID("s", fmt.Sprintf("k.%d", i))}}}); err != nil {
			t.Fatal(err)
		}
	}
	r, err := relay.NewJetStream(ctx, store, nc, relay.JetStreamConfig{
		Config: relay.Config{Streams: []string{"s"}, Window: 8, MeterProvider: mp}, SubjectPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	settled := func() bool {
		return db.Count(t, "SELECT count(*) FROM millpond_outbox WHERE consumer_group = 'relay' AND status IN ('delivered', 'dead_letter')") == 40
	}
	var during metrics
	runUntil(t, r.Run, func() bool {
		if !settled() {
			return false
		}
		during = collect(t, reader) // while Run runs: the gauge is registered
		return true
	})
	m := collect(t, reader)
	target := relay.AttrTarget.String(st.CachedInfo().Config.Name)
	stream := attribute.String("messaging.destination.name", "s")
	group := attribute.String("messaging.consumer.group.name", relay.DefaultGroup)
	for name, want := range map[string]int64{
		"millpond.relay.published":     36,
		"millpond.relay.duplicates":    3,
		"millpond.relay.failures":      1,
		"millpond.relay.dead_lettered": 1,
	} {
		if got := m.counter(name, target, stream, group); got != want {
			t.Errorf("%s = %d, want %d", name, got, want)
		}
	}
	unpublishable := relay.AttrReason.String(relay.ReasonUnpublishable)
	if got := m.counter("millpond.relay.failures", unpublishable); got != 1 {
		t.Errorf("failures{reason=unpublishable} = %d, want 1", got)
	}
	if got := m.counter("millpond.relay.dead_lettered", unpublishable); got != 1 {
		t.Errorf("dead_lettered{reason=unpublishable} = %d, want 1", got)
	}
	for _, name := range []string{"millpond.relay.publish.latency", "millpond.relay.delivery.latency"} {
		if _, n, _ := m.points(name, outbox.AttrOutcome.String(relay.OutcomePublished)); n != 36 {
			t.Errorf("%s{outcome=published} holds %d records, want 36", name, n)
		}
		if _, n, _ := m.points(name, outbox.AttrOutcome.String(relay.OutcomeDuplicate)); n != 3 {
			t.Errorf("%s{outcome=duplicate} holds %d records, want 3", name, n)
		}
	}
	if v, n, found := during.points("millpond.relay.in_flight", stream); !found || n != 1 || v < 0 || v > 8 {
		t.Errorf("in-flight gauge while running: found %v, %d points, value %d; want one point within the window 8", found, n, v)
	}
	if s := r.Stats(); s.Published != 36 || s.Duplicates != 3 || s.Failed != 1 || s.DeadLettered != 1 {
		t.Errorf("stats %+v, want 36 published, 3 duplicates, 1 failed, 1 dead-lettered", s)
	}
	if msgs := testnats.Messages(t, st); len(msgs) != 39 {
		t.Errorf("stream holds %d messages, want 39 (3 pre-published + 36)", len(msgs))
	}
}

// keyFailingPublisher fails every publish of one event key.
type keyFailingPublisher struct {
	message.Publisher
	key string
}

func (f keyFailingPublisher) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if m.UUID == f.key {
			return errors.New("broker refuses " + strings.Repeat("x", 3))
		}
	}
	return f.Publisher.Publish(topic, msgs...)
}

// TestWatermillMetrics: a publisher that always fails one event; with two
// attempts it is dead-lettered after two failures, the others published.
func TestWatermillMetrics(t *testing.T) {
	db := testdb.New(t, "postgres")
	store := db.Store(t)
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(ctx) }()
	if err := store.RegisterGroup(ctx, "s", relay.DefaultGroup); err != nil {
		t.Fatal(err)
	}
	pubsub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 100, Persistent: true}, watermill.NopLogger{})
	defer pubsub.Close()
	var evs []outbox.Event
	for i := range 6 {
		evs = append(evs, outbox.Event{Stream: "s", Key: fmt.Sprintf("e%d", i), Kind: "K", Payload: []byte("x")})
	}
	enqueue(t, db, store, evs...)
	w, err := relay.NewWatermill(store, keyFailingPublisher{Publisher: pubsub, key: "e2"}, relay.WatermillConfig{
		Config: relay.Config{Streams: []string{"s"}, MaxAttempts: 2, MaxBackoff: 20 * time.Millisecond, MeterProvider: mp},
		Topic:  func(s string) string { return "topic." + s }})
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, w.Run, func() bool {
		return db.Count(t, "SELECT count(*) FROM millpond_outbox WHERE consumer_group = 'relay' AND status IN ('delivered', 'dead_letter')") == 6
	})
	m := collect(t, reader)
	target := relay.AttrTarget.String("topic.s")
	publisher := relay.AttrReason.String(relay.ReasonPublisher)
	for _, c := range []struct {
		name string
		want int64
		with []attribute.KeyValue
	}{
		{"millpond.relay.published", 5, []attribute.KeyValue{target}},
		{"millpond.relay.duplicates", 0, nil},
		{"millpond.relay.failures", 2, []attribute.KeyValue{target, publisher}},
		{"millpond.relay.failures", 2, nil},
		{"millpond.relay.dead_lettered", 1, []attribute.KeyValue{target, publisher}},
		{"millpond.relay.dead_lettered", 1, nil},
	} {
		if got := m.counter(c.name, c.with...); got != c.want {
			t.Errorf("%s%v = %d, want %d", c.name, c.with, got, c.want)
		}
	}
	if s := w.Stats(); s.Published != 5 || s.Failed != 2 || s.DeadLettered != 1 {
		t.Errorf("stats %+v", s)
	}
	if n := db.Count(t, "SELECT count(*) FROM millpond_outbox WHERE event_key = 'e2' AND status = 'dead_letter' AND attempts = 2 AND last_error LIKE 'relay: publish: broker refuses%'"); n != 1 {
		t.Errorf("e2 is not dead-lettered after 2 attempts with the publisher's error")
	}
}

// TestJetStreamFailureReasons: while the stream stops taking the relay's
// subjects, publishes fail for want of a responder and are counted under
// that reason; once it takes them again, the events are published.
func TestJetStreamFailureReasons(t *testing.T) {
	store, db, nc, js, st, prefix := setup(t, 2*time.Minute)
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(ctx) }()
	if err := store.RegisterGroup(ctx, "s", relay.DefaultGroup); err != nil {
		t.Fatal(err)
	}
	r, err := relay.NewJetStream(ctx, store, nc, relay.JetStreamConfig{
		Config: relay.Config{Streams: []string{"s"}, MaxBackoff: 100 * time.Millisecond, PublishTimeout: 2 * time.Second, MeterProvider: mp}, SubjectPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	setSubjects := func(subjects ...string) {
		cfg := st.CachedInfo().Config
		cfg.Subjects = subjects
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	setSubjects(prefix + "-paused.>")
	enqueue(t, db, store, events(3)...)
	runUntil(t, r.Run, func() bool {
		if r.Stats().Failed >= 2 {
			setSubjects(prefix + ".>")
		}
		return delivered(t, db, 3)()
	})
	m := collect(t, reader)
	failed := r.Stats().Failed
	if got := m.counter("millpond.relay.failures", relay.AttrReason.String(relay.ReasonNoResponders)); got != failed || got < 2 {
		t.Errorf("failures{reason=no_responders} = %d, want every failed publish (%d, at least 2)", got, failed)
	}
	if got := m.counter("millpond.relay.published"); got != 3 {
		t.Errorf("published = %d, want 3", got)
	}
	if got := m.counter("millpond.relay.dead_lettered"); got != 0 {
		t.Errorf("dead_lettered = %d, want 0", got)
	}
}
