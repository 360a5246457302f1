package relay_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/internal/testnats"
	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/relay"
)

// clientsBecome waits up to 5 s for the embedded server to hold want
// client connections and fails the test if it does not.
func clientsBecome(t *testing.T, srv *testnats.Server, want int, when string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for srv.NumClients() != want && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := srv.NumClients(); n != want {
		t.Fatalf("%s: the server holds %d client connection(s), want %d", when, n, want)
	}
}

// runBriefly runs r for at most 3 s: a Run that should fail at once and
// runs instead ends the test's wait.
func runBriefly(r *relay.JetStream) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	return r.Run(ctx)
}

// closedPort is a loopback address where nothing listens.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// TestDeferredJetStream: a relay of NewDeferredJetStream connects to
// nothing until Open; before it, Stats, StreamName, DuplicateWindow and
// RegisterGroups answer and Run fails with ErrNotOpened. Open connects once (a second
// call does nothing), the relay relays, and Close closes its connection;
// Open and Run after Close fail with ErrClosed.
func TestDeferredJetStream(t *testing.T) {
	db := testdb.New(t, "postgres")
	store := db.Store(t)
	srv := testnats.Embedded(t)
	_, js := srv.Connect(t)
	prefix := testnats.UniqueName("rd")
	name := strings.ToUpper(prefix)
	testnats.Stream(t, js, name, 2*time.Minute, prefix+".>")
	base := srv.NumClients()
	ctx := context.Background()

	r, err := relay.NewDeferredJetStream(store, srv.URL(), relay.JetStreamConfig{
		Config: relay.Config{Streams: []string{"orders"}}, SubjectPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	clientsBecome(t, srv, base, "after NewDeferredJetStream")
	if s := r.Stats(); s != (relay.Stats{}) {
		t.Errorf("Stats before Open = %+v, want zero", s)
	}
	if got := r.StreamName(); got != "" {
		t.Errorf("StreamName before Open = %q, want the configured \"\" (found by subject at Open)", got)
	}
	if got := r.DuplicateWindow(); got != 0 {
		t.Errorf("DuplicateWindow before Open = %s, want 0", got)
	}
	if err := runBriefly(r); !errors.Is(err, relay.ErrNotOpened) {
		t.Fatalf("Run before Open: %v, want ErrNotOpened", err)
	}
	// It needs only the store (and an event enqueued before the group is
	// registered is not relayed).
	if err := r.RegisterGroups(ctx); err != nil {
		t.Fatalf("RegisterGroups before Open: %v", err)
	}
	clientsBecome(t, srv, base, "after RegisterGroups")

	if err := r.Open(ctx); err != nil {
		t.Fatal(err)
	}
	clientsBecome(t, srv, base+1, "after Open")
	if err := r.Open(ctx); err != nil {
		t.Fatalf("second Open: %v", err)
	}
	clientsBecome(t, srv, base+1, "after a second Open")
	if got, want := r.StreamName(), name; got != want {
		t.Errorf("StreamName after Open = %q, want %q", got, want)
	}
	if got := r.DuplicateWindow(); got != 2*time.Minute {
		t.Errorf("DuplicateWindow after Open = %s, want 2m0s", got)
	}

	enqueue(t, db, store, outbox.Event{Stream: "orders", Key: "o-1", Kind: "OrderPlaced", Payload: []byte(`{}`)})
	runUntil(t, r.Run, func() bool { return r.Stats().Published == 1 })

	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	clientsBecome(t, srv, base, "after Close")
	if err := r.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := r.Open(ctx); !errors.Is(err, relay.ErrClosed) {
		t.Errorf("Open after Close: %v, want ErrClosed", err)
	}
	if err := runBriefly(r); !errors.Is(err, relay.ErrClosed) {
		t.Errorf("Run after Close: %v, want ErrClosed", err)
	}
	clientsBecome(t, srv, base, "after Open following Close")
}

// TestDeferredJetStreamOpenFailsAndRetries: an Open that fails against the
// server (no stream captures the subjects) closes the connection it made,
// and a later Open tries again; Close before Open leaves Open failing with
// ErrClosed, having connected to nothing.
func TestDeferredJetStreamOpenFailsAndRetries(t *testing.T) {
	store := testdb.New(t, "sqlite").Store(t)
	srv := testnats.Embedded(t)
	_, js := srv.Connect(t)
	prefix := testnats.UniqueName("rdr")
	base := srv.NumClients()
	ctx := context.Background()
	cfg := relay.JetStreamConfig{Config: relay.Config{Streams: []string{"orders"}}, SubjectPrefix: prefix}

	r, err := relay.NewDeferredJetStream(store, srv.URL(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Open(ctx); !errors.Is(err, relay.ErrStreamNotFound) {
		t.Fatalf("Open without a stream: %v, want ErrStreamNotFound", err)
	}
	clientsBecome(t, srv, base, "after a failed Open")
	if err := runBriefly(r); !errors.Is(err, relay.ErrNotOpened) {
		t.Errorf("Run after a failed Open: %v, want ErrNotOpened", err)
	}
	testnats.Stream(t, js, strings.ToUpper(prefix), 2*time.Minute, prefix+".>")
	if err := r.Open(ctx); err != nil {
		t.Fatalf("Open once the stream exists: %v", err)
	}
	clientsBecome(t, srv, base+1, "after Open")
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	clientsBecome(t, srv, base, "after Close")

	r, err = relay.NewDeferredJetStream(store, srv.URL(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Open(ctx); !errors.Is(err, relay.ErrClosed) {
		t.Errorf("Open after Close: %v, want ErrClosed", err)
	}
	clientsBecome(t, srv, base, "after Open following Close")
}

// TestDeferredJetStreamChecksWithoutServer: NewDeferredJetStream refuses
// what needs no server to be refused, with nothing listening at the
// address; an unreachable server fails Open with ErrUnreachable. No
// error shows the URL's credentials.
func TestDeferredJetStreamChecksWithoutServer(t *testing.T) {
	store := testdb.New(t, "sqlite").Store(t)
	const user, secret = "alice", "Pw-s3cret"
	url := "nats://" + user + ":" + secret + "@" + closedPort(t)
	good := relay.JetStreamConfig{Config: relay.Config{Streams: []string{"orders"}}}
	noCredentials := func(what string, err error) {
		t.Helper()
		if err != nil && (strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), user)) {
			t.Errorf("%s: %q shows the credentials", what, err)
		}
	}
	for _, c := range []struct {
		name    string
		store   *outbox.Store
		servers string
		cfg     relay.JetStreamConfig
		want    error
	}{
		{"nil store", nil, url, good, relay.ErrInvalidConfig},
		{"no URL", store, " ", good, relay.ErrInvalidConfig},
		{"unencoded '/' in the password", store, "nats://" + user + ":12/" + secret + "@" + closedPort(t), good, relay.ErrInvalidConfig},
		{"no outbox stream", store, url, relay.JetStreamConfig{}, relay.ErrInvalidConfig},
		{"bad template", store, url, relay.JetStreamConfig{Config: good.Config, SubjectTemplate: "{prefix}.{nope}"}, relay.ErrInvalidSubjectTemplate},
		{"strict without {ordering_key}", store, url, relay.JetStreamConfig{Config: good.Config, Strict: true, SubjectTemplate: "{prefix}.{stream}.{kind}"}, relay.ErrInvalidSubjectTemplate},
	} {
		start := time.Now()
		r, err := relay.NewDeferredJetStream(c.store, c.servers, c.cfg)
		if r != nil || !errors.Is(err, c.want) {
			t.Errorf("%s: %v, %v; want %v", c.name, r, err, c.want)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("%s: NewDeferredJetStream took %s", c.name, d)
		}
		noCredentials(c.name, err)
	}

	r, err := relay.NewDeferredJetStream(store, url, good)
	if err != nil {
		t.Fatalf("a good configuration, server not contacted: %v", err)
	}
	err = r.Open(context.Background())
	if !errors.Is(err, relay.ErrUnreachable) {
		t.Errorf("Open, nothing listening: %v, want ErrUnreachable", err)
	}
	noCredentials("Open, nothing listening", err)
	err = runBriefly(r)
	if !errors.Is(err, relay.ErrNotOpened) {
		t.Errorf("Run after a failed Open: %v, want ErrNotOpened", err)
	}
	noCredentials("Run", err)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
}
