package tests

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/millpond/millpond/bus"
	"github.com/millpond/millpond/handlers"
	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/internal/testnats"
	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/relay"
)

// One trace from a request to every consumer: a request span enqueues an
// event in its transaction; the bus's handler and a bare Subscriber of
// another group each handle it in a consumer span that is a child (remote
// parent) of the enqueue's producer span, in the request's trace; and the
// JetStream relay's message carries a traceparent naming that same
// producer span, so a NATS consumer that extracts it joins the trace too.
// The relay records no span of its own.
func TestTraceFromRequestToHandlersAndRelay(t *testing.T) {
	db := testdb.New(t, "postgres")
	ctx := context.Background()
	rig := newTelemetryRig(t)
	store := db.Store(t, rig.options()...)
	nc, js := testnats.Connect(t)
	prefix := testnats.UniqueName("tr")
	st := testnats.Stream(t, js, strings.ToUpper(prefix), 2*time.Minute, prefix+".>")

	const stream = "trace.orders"
	var mu sync.Mutex
	var busSpan trace.SpanContext
	h := handlers.New("trace-bus", stream, "Placed", func(ctx context.Context, _ telOrder, _ handlers.Meta) error {
		mu.Lock()
		busSpan = trace.SpanContextFromContext(ctx)
		mu.Unlock()
		return nil
	})
	b, err := bus.New(store, bus.Config{Subscriber: outbox.SubscriberConfig{PollInterval: 20 * time.Millisecond}}, h)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.RegisterGroups(ctx); err != nil {
		t.Fatal(err)
	}
	for _, g := range []string{"trace-bare", relay.DefaultGroup} {
		if err := store.RegisterGroup(ctx, stream, g); err != nil {
			t.Fatal(err)
		}
	}

	reqCtx, req := rig.tracer.Tracer("test").Start(ctx, "POST /orders", trace.WithSpanKind(trace.SpanKindServer))
	tx, commit, rollback := db.Begin(t)
	if _, err := store.Enqueue(reqCtx, tx, outbox.Event{Stream: stream, Key: "order-1", Kind: "Placed", Payload: []byte(`{"n":1}`)}); err != nil {
		rollback()
		t.Fatal(err)
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}
	req.End()

	sends := 0
	var sendCtx trace.SpanContext
	for _, s := range rig.spans.Ended() {
		if s.SpanKind() == trace.SpanKindProducer {
			sends++
			sendCtx = s.SpanContext()
			if s.Parent().SpanID() != req.SpanContext().SpanID() || s.Name() != "send "+stream {
				t.Errorf("producer span %q: parent %s, want the request's %s", s.Name(), s.Parent().SpanID(), req.SpanContext().SpanID())
			}
		}
	}
	if sends != 1 || sendCtx.TraceID() != req.SpanContext().TraceID() {
		t.Fatalf("%d producer spans (trace %s); want one in the request's trace %s", sends, sendCtx.TraceID(), req.SpanContext().TraceID())
	}

	// The bus and a bare Subscriber.
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer b.Stop(context.Background())
	sub, msgs := subscribe(t, store, outbox.SubscriberConfig{ConsumerGroup: "trace-bare", PollInterval: 20 * time.Millisecond}, stream)
	var bareSpan trace.SpanContext
	select {
	case m := <-msgs:
		bareSpan = trace.SpanContextFromContext(m.Context())
		m.Ack()
	case <-time.After(10 * time.Second):
		t.Fatal("the bare Subscriber got nothing")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		got := busSpan.IsValid()
		mu.Unlock()
		if got {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the bus handler never ran")
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = sub.Close()
	if err := b.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	for what, sc := range map[string]trace.SpanContext{"bus handler": busSpan, "bare Subscriber": bareSpan} {
		if sc.TraceID() != req.SpanContext().TraceID() {
			t.Errorf("%s: trace %s, want the request's %s", what, sc.TraceID(), req.SpanContext().TraceID())
		}
	}
	consumers := map[string]bool{}
	ids := map[string]bool{} // messaging.message.id: the row id, one row per event and group
	for _, s := range rig.spans.Ended() {
		if s.SpanKind() != trace.SpanKindConsumer {
			continue
		}
		group := ""
		for _, kv := range s.Attributes() {
			switch kv.Key {
			case "messaging.consumer.group.name":
				group = kv.Value.AsString()
			case "messaging.message.id":
				ids[kv.Value.AsString()] = true
			}
		}
		consumers[group] = true
		if !s.Parent().IsRemote() || s.Parent().SpanID() != sendCtx.SpanID() || len(s.Links()) != 0 {
			t.Errorf("consumer span of %s: parent %s (remote %v), %d links; want the producer span %s as remote parent, no link",
				group, s.Parent().SpanID(), s.Parent().IsRemote(), len(s.Links()), sendCtx.SpanID())
		}
		if !s.SpanContext().Equal(busSpan) && !s.SpanContext().Equal(bareSpan) {
			t.Errorf("consumer span of %s is not the handler's context span", group)
		}
	}
	if !consumers["trace-bus"] || !consumers["trace-bare"] || len(consumers) != 2 {
		t.Errorf("consumer spans of groups %v; want trace-bus and trace-bare", consumers)
	}
	if len(ids) != 2 {
		t.Errorf("messaging.message.id values %v; want one per group's row", ids)
	}

	// The relay: the message's traceparent names the producer span.
	before := len(rig.spans.Ended())
	r, err := relay.NewJetStream(ctx, store, nc, relay.JetStreamConfig{Config: relay.Config{Streams: []string{stream}}, SubjectPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	deadline = time.Now().Add(20 * time.Second)
	for db.Count(t, "SELECT count(*) FROM millpond_outbox WHERE consumer_group = 'relay' AND status = 'delivered'") < 1 {
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatal("the relay delivered nothing")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	nm := testnats.Messages(t, st)
	if len(nm) != 1 {
		t.Fatalf("stream holds %d messages, want 1", len(nm))
	}
	// nats.Header keeps keys as written (traceparent): a carrier over it,
	// not propagation.HeaderCarrier, whose Get looks for Traceparent.
	if sc := trace.SpanContextFromContext(w3c.Extract(ctx, propagation.HeaderCarrier(nm[0].Header))); sc.IsValid() {
		t.Errorf("propagation.HeaderCarrier found %s in a NATS header; the README says it does not", sc.TraceID())
	}
	got := trace.SpanContextFromContext(w3c.Extract(ctx, natsCarrier(nm[0].Header)))
	if got.TraceID() != req.SpanContext().TraceID() || got.SpanID() != sendCtx.SpanID() {
		t.Errorf("NATS message's trace context %s/%s (traceparent %q); want the producer span %s/%s",
			got.TraceID(), got.SpanID(), nm[0].Header.Get("traceparent"), sendCtx.TraceID(), sendCtx.SpanID())
	}
	if n := len(rig.spans.Ended()); n != before {
		t.Errorf("the relay recorded %d spans; it records none", n-before)
	}
	assertNoSecrets(t, rig.collect(t), rig.spans.Ended())
}

// natsCarrier is a propagation.TextMapCarrier over a NATS message's
// headers, whose keys are case-sensitive.
type natsCarrier nats.Header

func (c natsCarrier) Get(key string) string { return nats.Header(c).Get(key) }
func (c natsCarrier) Set(key, value string) { nats.Header(c).Set(key, value) }
func (c natsCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
