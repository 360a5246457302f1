package relay_test

import (
	"bufio"
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
	if err := r.Open(ctx); !errors.Is(err, relay.ErrClosed) || strings.Contains(err.Error(), "before it opened") {
		t.Errorf("Open after Open and Close: %v, want ErrClosed (the relay had opened)", err)
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

// silentNATS is a NATS server that completes the client's handshake and
// answers its pings but nothing else: JetStream's API requests wait.
// conns receives each connection it accepts, and requests the subject of
// every PUB it reads.
func silentNATS(t *testing.T) (addr string, conns chan net.Conn, requests chan string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	conns, requests = make(chan net.Conn, 16), make(chan string, 64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = c.Close() })
			conns <- c
			go func() {
				_, _ = c.Write([]byte(`INFO {"server_id":"silent","version":"2.10.0","proto":1,"headers":true,"max_payload":1048576}` + "\r\n"))
				br := bufio.NewReader(c)
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						return
					}
					switch f := strings.Fields(line); {
					case len(f) > 0 && f[0] == "PING":
						_, _ = c.Write([]byte("PONG\r\n"))
					case len(f) > 1 && (f[0] == "PUB" || f[0] == "HPUB"):
						select {
						case requests <- f[1]:
						default:
						}
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), conns, requests
}

// TestDeferredJetStreamCloseEndsOpen: a Close while Open checks the
// stream on a server that does not answer JetStream's API closes Open's
// connection at once, and Open returns ErrClosed then, not when its
// checks time out.
func TestDeferredJetStreamCloseEndsOpen(t *testing.T) {
	store := testdb.New(t, "sqlite").Store(t)
	addr, conns, requests := silentNATS(t)
	r, err := relay.NewDeferredJetStream(store, "nats://"+addr, relay.JetStreamConfig{Config: relay.Config{Streams: []string{"orders"}}})
	if err != nil {
		t.Fatal(err)
	}
	opened := make(chan error, 1)
	go func() { opened <- r.Open(context.Background()) }()
	var conn net.Conn
	select {
	case conn = <-conns:
	case <-time.After(5 * time.Second):
		t.Fatal("Open did not connect")
	}
	select {
	case subj := <-requests:
		t.Logf("Open waits for %s", subj)
	case <-time.After(5 * time.Second):
		t.Fatal("Open sent no JetStream API request")
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	select {
	case err := <-opened:
		if !errors.Is(err, relay.ErrClosed) {
			t.Errorf("Open ended by Close: %v, want ErrClosed", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Open still checks the stream 3 s after Close")
	}
	// Close closed Open's connection: the server reads its end.
	_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 512)
	for {
		if _, err := conn.Read(buf); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Errorf("Open's connection is still open after Close (%s)", time.Since(start))
			}
			break
		}
	}
}
