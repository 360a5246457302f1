package relay_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/millpond/millpond/internal/testnats"
	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/relay"
)

// TestMetadataKeyRefusedByTheClientIsDeadLetteredAtOnce: a metadata key
// with a character nats.go refuses in a header key ('/', '@', '=', '(' …)
// passes relay.checkHeader, so PublishMsgAsync fails synchronously with
// nats.ErrBadHeaderMsg on every attempt: the event is retried with backoff
// (reason "other") instead of being dead-lettered at once as unpublishable.
func TestMetadataKeyRefusedByTheClientIsDeadLetteredAtOnce(t *testing.T) {
	store, db, nc, _, st, prefix := setup(t, 2*time.Minute)
	ctx := context.Background()
	if err := store.RegisterGroup(ctx, "s", relay.DefaultGroup); err != nil {
		t.Fatal(err)
	}
	enqueue(t, db, store, outbox.Event{Stream: "s", Key: "k.1", Kind: "K", Payload: []byte("one"),
		Metadata: map[string]string{"correlation/id": "c-1"}})
	r, err := relay.NewJetStream(ctx, store, nc, relay.JetStreamConfig{
		Config: relay.Config{Streams: []string{"s"}, MaxBackoff: 100 * time.Millisecond}, SubjectPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := r.Run(runCtx); err != nil {
		t.Fatal(err)
	}
	s := r.Stats()
	status := db.Count(t, "SELECT count(*) FROM millpond_outbox WHERE consumer_group = 'relay' AND status = 'dead_letter'")
	attempts := db.Count(t, "SELECT max(attempts) FROM millpond_outbox WHERE consumer_group = 'relay'")
	badHeader := db.Count(t, "SELECT count(*) FROM millpond_outbox WHERE consumer_group = 'relay' AND last_error LIKE '%could not decode headers%'")
	t.Logf("rows whose last error is nats.ErrBadHeaderMsg: %d", badHeader)
	t.Logf("stats %+v, dead-lettered rows %d, attempts %d, stream messages %d", s, status, attempts, len(testnats.Messages(t, st)))
	if s.DeadLettered != 1 || s.Failed != 1 || status != 1 {
		t.Errorf("an event whose metadata key cannot be a NATS header was not dead-lettered at once as unpublishable: stats %+v, dead-lettered rows %d, attempts %d", s, status, attempts)
	}
}

// TestStrictModeRelaysAKeyEnqueuedAgainAfterPurge: strict mode has no
// window; it judged "already published" by the subject's last message
// carrying the event's Nats-Msg-Id (<stream>/<key>) alone. A new event
// enqueued under a purged key, whatever the time since, was taken for its
// predecessor: acknowledged in the outbox and never stored in the stream.
// Its place in its key's sequence tells them apart.
func TestStrictModeRelaysAKeyEnqueuedAgainAfterPurge(t *testing.T) {
	store, db, nc, _, st, prefix := setup(t, 100*time.Millisecond)
	ctx := context.Background()
	if err := store.RegisterGroup(ctx, "s", relay.DefaultGroup); err != nil {
		t.Fatal(err)
	}
	cfg := relay.JetStreamConfig{Config: relay.Config{Streams: []string{"s"}, MaxBackoff: 100 * time.Millisecond},
		SubjectPrefix: prefix, Strict: true}
	enqueue(t, db, store, outbox.Event{Stream: "s", Key: "k.1", Kind: "K", Payload: []byte("first"), OrderingKey: "agg.1"})
	r, err := relay.NewJetStream(ctx, store, nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, r.Run, delivered(t, db, 1))
	if _, err := store.Purge(ctx, 0, 1000); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // well past the stream's duplicate window
	tx, commit, rollback := db.Begin(t)
	res, err := store.Enqueue(ctx, tx, outbox.Event{Stream: "s", Key: "k.1", Kind: "K", Payload: []byte("second"), OrderingKey: "agg.1"})
	if err != nil {
		rollback()
		t.Fatal(err)
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}
	if !res.Inserted {
		t.Fatalf("the purged key was not enqueued again: %+v", res)
	}
	r2, err := relay.NewJetStream(ctx, store, nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, r2.Run, delivered(t, db, 1))
	var payloads []string
	for _, m := range testnats.Messages(t, st) {
		payloads = append(payloads, string(m.Data))
	}
	t.Logf("second relay stats %+v; stream payloads %q", r2.Stats(), payloads)
	if len(payloads) != 2 {
		t.Errorf("strict mode took the new event of purged key k.1 for an already published one: stats %+v, stream holds %q", r2.Stats(), payloads)
	}
}

// TestPayloadAboveTheStreamsLimitIsDeadLetteredAtOnce: a payload the
// stream can never take (above its MaxMsgSize: JetStream refuses it with
// "message size exceeds maximum allowed") was retried with backoff up to
// MaxAttempts (reason "rejected"), holding its ordering key all that time;
// it is dead-lettered at once as unpublishable.
func TestPayloadAboveTheStreamsLimitIsDeadLetteredAtOnce(t *testing.T) {
	store, db, nc, js, _, prefix := setup(t, 2*time.Minute)
	ctx := context.Background()
	small := strings.ToUpper(prefix) + "_SMALL"
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: small, Subjects: []string{prefix + "-small.>"},
		Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute, MaxMsgSize: 64}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), small) })
	if err := store.RegisterGroup(ctx, "s", relay.DefaultGroup); err != nil {
		t.Fatal(err)
	}
	enqueue(t, db, store, outbox.Event{Stream: "s", Key: "k.1", Kind: "K", Payload: bytes.Repeat([]byte("x"), 1000), OrderingKey: "agg.1"})
	r, err := relay.NewJetStream(ctx, store, nc, relay.JetStreamConfig{
		Config: relay.Config{Streams: []string{"s"}, MaxBackoff: 100 * time.Millisecond}, SubjectPrefix: prefix + "-small"})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := r.Run(runCtx); err != nil {
		t.Fatal(err)
	}
	s := r.Stats()
	dead := db.Count(t, "SELECT count(*) FROM millpond_outbox WHERE consumer_group = 'relay' AND status = 'dead_letter'")
	rejected := db.Count(t, "SELECT count(*) FROM millpond_outbox WHERE consumer_group = 'relay' AND last_error LIKE '%exceeds maximum%'")
	t.Logf("stats %+v, dead-lettered rows %d, rows whose last error is the size refusal %d", s, dead, rejected)
	if s.DeadLettered != 1 || s.Failed != 1 || dead != 1 {
		t.Errorf("a payload above the stream's limit was not dead-lettered at once as unpublishable: stats %+v, dead-lettered rows %d", s, dead)
	}
}
