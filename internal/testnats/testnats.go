// Package testnats gives tests NATS JetStream: the shared server
// (MILLPOND_NATS_URL, default nats://127.0.0.1:4222) with a stream of a
// unique name per test, deleted when the test ends, or a private embedded
// server on its own port and store directory, for tests that restart or
// stop the broker.
//
// When the shared server cannot be reached the test is skipped with the
// reason, unless MILLPOND_REQUIRE_DATABASES=1 (set by CI), which turns the
// skip into a failure.
package testnats

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/millpond/millpond/internal/testdb"
)

// URL is the shared server tests use.
func URL() string {
	if v := os.Getenv("MILLPOND_NATS_URL"); v != "" {
		return v
	}
	return "nats://127.0.0.1:4222"
}

// Connect connects to the shared server, closed at cleanup; it skips or
// fails the test when the server is down or has no JetStream.
func Connect(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(URL(), nats.Timeout(3*time.Second))
	var js jetstream.JetStream
	if err == nil {
		js, err = jetstream.New(nc)
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err = js.AccountInfo(ctx)
			cancel()
		}
		if err != nil {
			nc.Close()
		}
	}
	if err != nil {
		msg := fmt.Sprintf("NATS JetStream server not reachable (%v); set MILLPOND_NATS_URL or start nats-server -js", err)
		if testdb.Required() {
			t.Fatalf("%s, and MILLPOND_REQUIRE_DATABASES=1 forbids skipping", msg)
		}
		t.Skip(msg)
	}
	t.Cleanup(nc.Close)
	return nc, js
}

var seq atomic.Int64

// UniqueName returns a stream or subject token unique to this process and
// call, starting with prefix.
func UniqueName(prefix string) string {
	return fmt.Sprintf("%s_%d_%d_%d", prefix, os.Getpid(), time.Now().UnixNano()%1_000_000, seq.Add(1))
}

// Stream creates a file-backed stream of the given subjects and duplicate
// window, deleted at cleanup.
func Stream(t testing.TB, js jetstream.JetStream, name string, duplicates time.Duration, subjects ...string) jetstream.Stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: subjects, Storage: jetstream.FileStorage, Duplicates: duplicates})
	if err != nil {
		t.Fatalf("create stream %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, name)
	})
	return s
}

// Server is a private embedded NATS server with JetStream.
type Server struct {
	t    testing.TB
	opts server.Options
	srv  *server.Server
}

// Embedded starts a private server on a free loopback port with its store
// in a directory of its own; it is shut down at cleanup.
func Embedded(t testing.TB) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	s := &Server{t: t, opts: server.Options{
		Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: t.TempDir(),
		NoSigs: true, NoLog: true, MaxPayload: 1 << 20,
	}}
	s.Start()
	t.Cleanup(s.Stop)
	return s
}

// URL is the server's address.
func (s *Server) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", s.opts.Port) }

// Start starts the server (again, after Stop: same port, same store).
func (s *Server) Start() {
	s.t.Helper()
	opts := s.opts
	srv, err := server.NewServer(&opts)
	if err != nil {
		s.t.Fatalf("embedded NATS: %v", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(20 * time.Second) {
		s.t.Fatalf("embedded NATS did not start on %s", s.URL())
	}
	s.srv = srv
}

// Stop shuts the server down; its store stays for Start.
func (s *Server) Stop() {
	if s.srv != nil {
		s.srv.Shutdown()
		s.srv.WaitForShutdown()
		s.srv = nil
	}
}

// NumClients is how many client connections the server holds.
func (s *Server) NumClients() int {
	s.t.Helper()
	if s.srv == nil {
		s.t.Fatal("embedded NATS is stopped")
	}
	return s.srv.NumClients()
}

// Restart stops and starts the server.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.Start()
}

// Connect connects to the embedded server, closed at cleanup, reconnecting
// across restarts.
func (s *Server) Connect(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(s.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// Msg is one stored message.
type Msg struct {
	Seq     uint64
	Subject string
	Header  nats.Header
	Data    []byte
}

// Messages reads every message of a stream in sequence order (through an
// ordered consumer).
func Messages(t testing.TB, s jetstream.Stream) []Msg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := int(info.State.Msgs)
	var out []Msg
	if want == 0 {
		return out
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for len(out) < want {
		batch, err := cons.Fetch(min(want-len(out), 1000), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatalf("fetch: %v", err)
		}
		n := 0
		for m := range batch.Messages() {
			md, err := m.Metadata()
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, Msg{Seq: md.Sequence.Stream, Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
			n++
		}
		if batch.Error() != nil {
			t.Fatalf("fetch: %v", batch.Error())
		}
		if n == 0 {
			t.Fatalf("read %d of %d messages, then nothing", len(out), want)
		}
	}
	return out
}
