package relay_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/internal/testnats"
	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/relay"
)

// setup gives a migrated PostgreSQL store, the shared NATS server and a
// stream of a unique name capturing "<prefix>.>".
func setup(t *testing.T, window time.Duration) (*outbox.Store, *testdb.Database, *nats.Conn, jetstream.JetStream, jetstream.Stream, string) {
	t.Helper()
	db := testdb.New(t, "postgres")
	store := db.Store(t)
	nc, js := testnats.Connect(t)
	prefix := testnats.UniqueName("rt")
	st := testnats.Stream(t, js, strings.ToUpper(prefix), window, prefix+".>")
	return store, db, nc, js, st, prefix
}

func enqueue(t *testing.T, db *testdb.Database, store *outbox.Store, evs ...outbox.Event) {
	t.Helper()
	tx, commit, rollback := db.Begin(t)
	for _, ev := range evs {
		if _, err := store.Enqueue(context.Background(), tx, ev); err != nil {
			rollback()
			t.Fatal(err)
		}
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}
}

// runUntil runs the relay until cond holds (or 20 s), then stops it.
func runUntil(t *testing.T, run func(context.Context) error, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatal("condition not met within 20 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
}

func delivered(t *testing.T, db *testdb.Database, n int64) func() bool {
	return func() bool {
		return db.Count(t, "SELECT count(*) FROM millpond_outbox WHERE consumer_group = 'relay' AND status = 'delivered'") >= n
	}
}

func TestBadConfigurationFailsAtStart(t *testing.T) {
	store, _, nc, js, st, prefix := setup(t, 2*time.Minute)
	ctx := context.Background()
	base := relay.JetStreamConfig{Config: relay.Config{Streams: []string{"s"}}, SubjectPrefix: prefix}

	cfg := base
	cfg.Stream = "NO_SUCH_STREAM_" + strings.ToUpper(prefix)
	if _, err := relay.NewJetStream(ctx, store, nc, cfg); !errors.Is(err, relay.ErrStreamNotFound) {
		t.Errorf("missing stream: %v, want ErrStreamNotFound", err)
	}
	cfg = base
	cfg.SubjectPrefix = prefix + "-uncaptured"
	if _, err := relay.NewJetStream(ctx, store, nc, cfg); !errors.Is(err, relay.ErrStreamNotFound) {
		t.Errorf("no stream captures the subjects: %v, want ErrStreamNotFound", err)
	}

	short := testnats.Stream(t, js, strings.ToUpper(prefix)+"_SHORT", 20*time.Second, prefix+"-short.>")
	cfg = base
	cfg.SubjectPrefix = prefix + "-short"
	_, err := relay.NewJetStream(ctx, store, nc, cfg)
	if !errors.Is(err, relay.ErrDuplicateWindowTooShort) || !strings.Contains(err.Error(), "at least 1m0s") {
		t.Errorf("short window: %v, want ErrDuplicateWindowTooShort naming 1m0s", err)
	}
	// Held claims (PostgreSQL): a held batch may stay open for four publish
	// timeouts, 20 s here: 30 s needed.
	cfg.Lease, cfg.MaxBackoff, cfg.PublishTimeout = 5*time.Second, 5*time.Second, 5*time.Second
	if _, err := relay.NewJetStream(ctx, store, nc, cfg); !errors.Is(err, relay.ErrDuplicateWindowTooShort) || !strings.Contains(err.Error(), "at least 30s") {
		t.Errorf("held claims, short window: %v, want ErrDuplicateWindowTooShort naming 30s", err)
	}
	cfg.UseLeases = true
	if _, err := relay.NewJetStream(ctx, store, nc, cfg); err != nil {
		t.Errorf("leased claims: 15 s needed, 20 s window: %v", err)
	}
	cfg.UseLeases = false
	cfg.PublishTimeout = 2 * time.Second
	if _, err := relay.NewJetStream(ctx, store, nc, cfg); err != nil {
		t.Errorf("held claims: 15 s needed, 20 s window: %v", err)
	}
	// A relay over another database claims under leases: 15 s needed, not
	// the 30 s of held claims.
	cfg.PublishTimeout = 5 * time.Second
	sqliteStore := testdb.New(t, "sqlite").Store(t)
	if _, err := relay.NewJetStream(ctx, sqliteStore, nc, cfg); err != nil {
		t.Errorf("a relay over SQLite (leased claims): 15 s needed, 20 s window: %v", err)
	}
	cfg.Strict = true
	cfg.Lease = time.Minute
	if _, err := relay.NewJetStream(ctx, store, nc, cfg); err != nil {
		t.Errorf("strict mode needs no window: %v", err)
	}
	_ = short

	for _, tmpl := range []string{"{prefix}..{kind}", "{prefix}.*.{kind}", "{prefix}.{kind}.>", "{prefix}.{nope}", "{prefix}.a b", "{prefix}.{stream}x", ""} {
		cfg = base
		cfg.SubjectTemplate = tmpl
		if tmpl == "" {
			cfg.SubjectPrefix = "bad..prefix"
		}
		if _, err := relay.NewJetStream(ctx, store, nc, cfg); !errors.Is(err, relay.ErrInvalidSubjectTemplate) {
			t.Errorf("template %q: %v, want ErrInvalidSubjectTemplate", tmpl, err)
		}
	}
	cfg = base
	cfg.Strict = true
	cfg.SubjectTemplate = "{prefix}.{stream}.{kind}"
	if _, err := relay.NewJetStream(ctx, store, nc, cfg); !errors.Is(err, relay.ErrInvalidSubjectTemplate) {
		t.Errorf("strict without {ordering_key}: %v, want ErrInvalidSubjectTemplate", err)
	}

	_, err = relay.Connect("nats://alice:s3cret-pw@127.0.0.1:1", nats.Timeout(time.Second))
	if !errors.Is(err, relay.ErrUnreachable) || strings.Contains(err.Error(), "s3cret-pw") || strings.Contains(err.Error(), "alice") {
		t.Errorf("unreachable server: %v, want ErrUnreachable without credentials", err)
	}
	// Credentials that are not percent-encoded: the URL does not parse,
	// and nats.go's error would quote it whole.
	for _, servers := range []string{
		"nats://alice:Pa%ss-w0rd@127.0.0.1:4222",
		"nats://alice:pa ss@127.0.0.1:4222",
		"nats://127.0.0.1:4222, alice:Pa%ss-w0rd@127.0.0.1:4223",
	} {
		_, err = relay.Connect(servers, nats.Timeout(time.Second))
		if !errors.Is(err, relay.ErrInvalidConfig) || strings.Contains(err.Error(), "ss-w0rd") || strings.Contains(err.Error(), "alice") {
			t.Errorf("unparseable URL: %v, want ErrInvalidConfig without credentials", err)
		}
	}
	closed, _ := testnats.Connect(t)
	closed.Close()
	if _, err := relay.NewJetStream(ctx, store, closed, base); !errors.Is(err, relay.ErrUnreachable) {
		t.Errorf("closed connection: %v, want ErrUnreachable", err)
	}
	cfg = base
	cfg.Streams = nil
	if _, err := relay.NewJetStream(ctx, store, nc, cfg); !errors.Is(err, relay.ErrInvalidConfig) {
		t.Errorf("no stream: %v, want ErrInvalidConfig", err)
	}
	if r, err := relay.NewJetStream(ctx, store, nc, base); err != nil || r.StreamName() != st.CachedInfo().Config.Name {
		t.Errorf("good configuration: %v", err)
	}
}

func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"nats://alice:pw@h:4222":             "nats://[REDACTED]@h:4222",
		"nats://token@h:4222,nats://h2:4222": "nats://[REDACTED]@h:4222,nats://h2:4222",
		"tls://u:p@h":                        "tls://[REDACTED]@h",
		"nats://127.0.0.1:4222":              "nats://127.0.0.1:4222",
		"secret@h:4222":                      "[REDACTED]@h:4222",
		"nats://u:p%zz@h":                    "[REDACTED]",
	} {
		if got := relay.RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestDuplicatePubAckCountsAsSuccess: the event is already in the stream
// (a relay crashed after the PubAck); the relay's publish gets a PubAck
// marked Duplicate and acknowledges the event; the stream keeps one copy.
func TestDuplicatePubAckCountsAsSuccess(t *testing.T) {
	store, db, nc, js, st, prefix := setup(t, 2*time.Minute)
	ctx := context.Background()
	r, err := relay.NewJetStream(ctx, store, nc, relay.JetStreamConfig{Config: relay.Config{Streams: []string{"s"}}, SubjectPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.RegisterGroup(ctx, "s", relay.DefaultGroup); err != nil {
		t.Fatal(err)
	}
	enqueue(t, db, store, outbox.Event{Stream: "s", Key: "k.3", Kind: "K", Payload: []byte("three")},
		outbox.Event{Stream: "s", Key: "k.4", Kind: "K", Payload: []byte("four")})
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: prefix + ".s.K", Data: []byte("three"),
		Header: nats.Header{jetstream.MsgIDHeader: []string{relay.MsgID("s", "k.3")}}}); err != nil {
		t.Fatal(err)
	}
	runUntil(t, r.Run, delivered(t, db, 2))
	if s := r.Stats(); s.Duplicates != 1 || s.Published != 1 {
		t.Errorf("stats %+v, want 1 published and 1 duplicate", s)
	}
	msgs := testnats.Messages(t, st)
	if len(msgs) != 2 {
		t.Fatalf("%d messages, want 2 (k.3 once, k.4)", len(msgs))
	}
	if got := msgs[1].Header.Get(relay.HeaderKey); got != "k.4" || string(msgs[1].Data) != "four" {
		t.Errorf("last message is %q %q, want k.4", got, msgs[1].Data)
	}
}

// TestStrictMode: with no duplicate window left, an event already on its
// subject is recognised by reading the subject's last message; a foreign
// message on the subject is a conflict and the event is not acknowledged.
func TestStrictMode(t *testing.T) {
	store, db, nc, js, st, prefix := setup(t, 100*time.Millisecond)
	ctx := context.Background()
	if err := store.RegisterGroup(ctx, "s", relay.DefaultGroup); err != nil {
		t.Fatal(err)
	}
	cfg := relay.JetStreamConfig{Config: relay.Config{Streams: []string{"s"}, MaxBackoff: 100 * time.Millisecond}, SubjectPrefix: prefix, Strict: true}
	subject := func(orderingKey string) string { return prefix + ".s.K." + relay.EncodeToken(orderingKey) }

	// a.1 of key "agg.1" is already there (an earlier relay published it
	// and died), long past the duplicate window.
	enqueue(t, db, store,
		outbox.Event{Stream: "s", Key: "a.1", Kind: "K", Payload: []byte("a1"), OrderingKey: "agg.1"},
		outbox.Event{Stream: "s", Key: "a.2", Kind: "K", Payload: []byte("a2"), OrderingKey: "agg.1"},
		outbox.Event{Stream: "s", Key: "u.1", Kind: "K", Payload: []byte("u1")})
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: subject("agg.1"), Data: []byte("a1"), Header: nats.Header{
		jetstream.MsgIDHeader: []string{relay.MsgID("s", "a.1")}, relay.HeaderStream: []string{"s"},
		relay.HeaderKey: []string{"a.1"}, relay.HeaderOrderingKey: []string{"agg.1"}, relay.HeaderOrderingSeq: []string{"1"}}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // past the duplicate window
	r, err := relay.NewJetStream(ctx, store, nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, r.Run, delivered(t, db, 3))
	// Strict mode claims under leases, not held (a held settle clears the
	// claim key, a leased acknowledgement keeps it).
	if n := db.Count(t, "SELECT count(*) FROM millpond_outbox WHERE consumer_group = 'relay' AND event_key = 'u.1' AND claim_key <> ''"); n != 1 {
		t.Error("strict mode: u.1 was not claimed under a lease")
	}
	if s := r.Stats(); s.Duplicates != 1 || s.Published != 2 || s.Conflicts != 0 {
		t.Errorf("stats %+v, want 2 published, 1 already published", s)
	}
	msgs := testnats.Messages(t, st)
	if len(msgs) != 3 {
		t.Fatalf("%d messages, want 3 (a.1 once, a.2, u.1)", len(msgs))
	}
	bySubject := map[string][]string{}
	for _, m := range msgs {
		bySubject[m.Subject] = append(bySubject[m.Subject], m.Header.Get(relay.HeaderKey))
	}
	if got := fmt.Sprint(bySubject[subject("agg.1")]); got != "[a.1 a.2]" {
		t.Errorf("key agg.1's subject holds %s, want [a.1 a.2]", got)
	}
	if got := fmt.Sprint(bySubject[prefix+".s.K."+relay.UnorderedMark+"u~1"]); got != "[u.1]" {
		t.Errorf("the unordered event's subject holds %s, want [u.1]", got)
	}

	// Something else writes to the key's subject: the next event is a
	// conflict, retried and never acknowledged while the foreign message
	// is the subject's last.
	if _, err := js.Publish(ctx, subject("agg.1"), []byte("foreign")); err != nil {
		t.Fatal(err)
	}
	enqueue(t, db, store, outbox.Event{Stream: "s", Key: "a.3", Kind: "K", Payload: []byte("a3"), OrderingKey: "agg.1"})
	r2, err := relay.NewJetStream(ctx, store, nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, r2.Run, func() bool { return r2.Stats().Conflicts >= 2 })
	if n := db.Count(t, "SELECT count(*) FROM millpond_outbox WHERE consumer_group = 'relay' AND event_key = 'a.3' AND status <> 'delivered' AND last_error LIKE '%strict mode conflict%'"); n != 1 {
		t.Errorf("a.3 not held back with the conflict as its last error")
	}
	if msgs := testnats.Messages(t, st); len(msgs) != 4 {
		t.Errorf("%d messages, want 4 (a.3 not published)", len(msgs))
	}
}

// TestWatermillRelay relays to Watermill's gochannel at least once, UUID =
// event key, per-key order, metadata kept.
func TestWatermillRelay(t *testing.T) {
	db := testdb.New(t, "postgres")
	store := db.Store(t)
	ctx := context.Background()
	if err := store.RegisterGroup(ctx, "s", relay.DefaultGroup); err != nil {
		t.Fatal(err)
	}
	// Publish returns once the subscriber acked: without that gochannel
	// hands each message over in a goroutine of its own, and two messages
	// published in order may arrive in the other order.
	pubsub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 1000, Persistent: true, BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	defer pubsub.Close()
	out, err := pubsub.Subscribe(ctx, "topic.s")
	if err != nil {
		t.Fatal(err)
	}
	var evs []outbox.Event
	for i := range 200 {
		evs = append(evs, outbox.Event{Stream: "s", Key: fmt.Sprintf("e%d", i), Kind: "K", Payload: fmt.Appendf(nil, "%d", i),
			OrderingKey: fmt.Sprintf("k%d", i%7), Metadata: map[string]string{"traceparent": "tp"}})
	}
	enqueue(t, db, store, evs...)
	w, err := relay.NewWatermill(store, pubsub, relay.WatermillConfig{Config: relay.Config{Streams: []string{"s"}, Window: 16},
		Topic: func(s string) string { return "topic." + s }})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	lastSeq := map[string]string{}
	runUntil(t, w.Run, func() bool {
		for {
			select {
			case m := <-out:
				m.Ack()
				got[m.UUID]++
				if m.Metadata.Get("traceparent") != "tp" || m.Metadata.Get(relay.MetadataKey) != m.UUID {
					t.Errorf("message %s: metadata %v", m.UUID, m.Metadata)
				}
				k, seq := m.Metadata.Get(relay.MetadataOrderingKey), m.Metadata.Get(relay.MetadataOrderingSeq)
				if prev := lastSeq[k]; prev != "" && atoi(seq) != atoi(prev)+1 {
					t.Errorf("key %s: seq %s after %s", k, seq, prev)
				}
				lastSeq[k] = seq
			default:
				return len(got) == 200 && delivered(t, db, 200)()
			}
		}
	})
	for _, ev := range evs {
		if got[ev.Key] < 1 {
			t.Errorf("event %s not relayed", ev.Key)
		}
	}
	if w.Stats().Published != 200 {
		t.Errorf("stats %+v", w.Stats())
	}
}

func atoi(s string) int {
	var n int
	fmt.Sscanf(s, "%d", &n)
	return n
}

// failingPublisher fails the first n publishes.
type failingPublisher struct {
	message.Publisher
	n int
}

func (f *failingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if f.n > 0 {
		f.n--
		return errors.New("broker down")
	}
	return f.Publisher.Publish(topic, msgs...)
}

// TestWatermillRelayRetries: a failed Publish leaves the event pending; it
// is relayed on a later attempt (at least once).
func TestWatermillRelayRetries(t *testing.T) {
	db := testdb.New(t, "postgres")
	store := db.Store(t)
	ctx := context.Background()
	if err := store.RegisterGroup(ctx, "s", relay.DefaultGroup); err != nil {
		t.Fatal(err)
	}
	pubsub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 10, Persistent: true}, watermill.NopLogger{})
	defer pubsub.Close()
	out, _ := pubsub.Subscribe(ctx, "s")
	enqueue(t, db, store, outbox.Event{Stream: "s", Key: "only", Kind: "K", Payload: []byte("x")})
	w, err := relay.NewWatermill(store, &failingPublisher{Publisher: pubsub, n: 2},
		relay.WatermillConfig{Config: relay.Config{Streams: []string{"s"}, Window: 1, MaxBackoff: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, w.Run, delivered(t, db, 1))
	m := <-out
	if m.UUID != "only" || w.Stats().Failed != 2 {
		t.Errorf("uuid %q, stats %+v", m.UUID, w.Stats())
	}
}

// quotingPublisher fails every publish with an error that quotes the topic
// and the message's UUID, as many broker clients' errors do.
type quotingPublisher struct{ message.Publisher }

func (quotingPublisher) Publish(topic string, msgs ...*message.Message) error {
	return fmt.Errorf("broker refused message %s on topic %s (ordering key %s)", msgs[0].UUID, topic, msgs[0].Metadata.Get(relay.MetadataOrderingKey))
}

// TestFailureTextHoldsNoKeys: a broker client's error may quote the message
// id (the event key) and the subject or topic (the stream, the ordering
// key): the failure's stored reason (last_error: ListDead, the CLI, the
// admin UI) and the relay's log lines hold none of them.
func TestFailureTextHoldsNoKeys(t *testing.T) {
	db := testdb.New(t, "postgres")
	store := db.Store(t)
	ctx := context.Background()
	const stream, key, orderingKey = "payments-eu", "customer-ada.lovelace", "account-4711"
	if err := store.RegisterGroup(ctx, stream, relay.DefaultGroup); err != nil {
		t.Fatal(err)
	}
	enqueue(t, db, store, outbox.Event{Stream: stream, Key: key, Kind: "K", Payload: []byte("x"), OrderingKey: orderingKey})
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	w, err := relay.NewWatermill(store, quotingPublisher{}, relay.WatermillConfig{
		Config: relay.Config{Streams: []string{stream}, MaxAttempts: 2, MaxBackoff: 20 * time.Millisecond, Logger: logger},
		Topic:  func(s string) string { return "topic." + s }})
	if err != nil {
		t.Fatal(err)
	}
	var dead []outbox.DeadEvent
	runUntil(t, w.Run, func() bool {
		dead, err = store.ListDead(ctx, outbox.DeadQuery{Stream: stream, Group: relay.DefaultGroup, Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		return len(dead) == 1
	})
	reason := dead[0].LastError
	if !strings.Contains(reason, "broker refused message [REDACTED] on topic topic.[REDACTED]") {
		t.Errorf("last error %q: want the broker's error with the key and stream redacted", reason)
	}
	for _, s := range []string{key, orderingKey, stream} {
		if strings.Contains(reason, s) || strings.Contains(logs.String(), s) {
			t.Errorf("%q reached the last error %q or the log:\n%s", s, reason, logs.String())
		}
	}
}

// TestNATSPasswordWithUnencodedSeparator: a NATS URL whose password holds
// an unencoded '/', '?' or '#' parses with the password's rest as a path,
// query or fragment (its first digits as a port): RedactURL printed the
// path, and Connect passed the URL to nats.go, whose errors then named it.
// RedactURL hides everything before the last '@', and Connect refuses
// such a URL with ErrInvalidConfig, naming nothing of it.
func TestNATSPasswordWithUnencodedSeparator(t *testing.T) {
	const secret = "Pw-s3cret"
	for _, servers := range []string{
		"nats://alice:12/" + secret + "@127.0.0.1:4222",
		"nats://alice:#" + secret + "@127.0.0.1:4222",
		"nats://alice:12?" + secret + "@127.0.0.1:4222",
		"nats://127.0.0.1:4222,nats://alice:/" + secret + "@127.0.0.1:4223",
		"alice:12/" + secret + "@127.0.0.1:4222",
	} {
		if got := relay.RedactURL(servers); strings.Contains(got, secret) || strings.Contains(got, "alice") || !strings.Contains(got, "127.0.0.1") {
			t.Errorf("RedactURL(…) = %q: shows the credentials or hides the host", got)
		}
		nc, err := relay.Connect(servers, nats.Timeout(time.Second))
		if err == nil {
			nc.Close()
		}
		if !errors.Is(err, relay.ErrInvalidConfig) || strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), "alice") {
			t.Errorf("Connect(%s): %v, want ErrInvalidConfig without credentials", relay.RedactURL(servers), err)
		}
	}
}
