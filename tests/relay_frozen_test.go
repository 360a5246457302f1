package tests

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/millpond/millpond/internal/testnats"
	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/relay"
)

// lockedBuffer is a bytes.Buffer several goroutines may write.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestRelayStopsWithFrozenDatabase: a JetStream relay stopped while its
// PostgreSQL server does not answer (a hung host) returns from Run within
// its bounds, held claims (the default) or leases; once the database
// answers again a new relay puts every event into the stream, and every
// event is there exactly once.
func TestRelayStopsWithFrozenDatabase(t *testing.T) {
	for _, useLeases := range []bool{false, true} {
		t.Run(map[bool]string{false: "Held", true: "Leases"}[useLeases], func(t *testing.T) {
			f := newFrozenEnv(t)
			nc, js := testnats.Connect(t)
			prefix := testnats.UniqueName("frz")
			st := testnats.Stream(t, js, strings.ToUpper(prefix), 2*time.Minute, prefix+".>")
			ctx := context.Background()
			if err := f.s.RegisterGroup(ctx, "frozen", relay.DefaultGroup); err != nil {
				t.Fatal(err)
			}
			const n = 600
			evs := make([]outbox.Event, n)
			for i := range evs {
				evs[i] = outbox.Event{Stream: "frozen", Key: fmt.Sprintf("ev-%d", i), Kind: "K", Payload: []byte(`{}`)}
				if i%2 == 0 {
					evs[i].OrderingKey = fmt.Sprintf("key-%d", i%20)
				}
			}
			f.enqueueAll(evs...)
			var logs lockedBuffer
			cfg := relay.JetStreamConfig{Config: relay.Config{
				Streams: []string{"frozen"}, UseLeases: useLeases, Lease: 6 * time.Second,
				PublishTimeout: time.Second, CloseTimeout: time.Second, PollInterval: 10 * time.Millisecond,
				BatchSize: 50, Window: 64, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
			}, SubjectPrefix: prefix}
			r1, err := relay.NewJetStream(ctx, f.store, nc, cfg)
			if err != nil {
				t.Fatal(err)
			}
			runCtx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- r1.Run(runCtx) }()
			delivered := func() int64 {
				return f.count("SELECT COUNT(*) FROM millpond_deliveries WHERE stream = ? AND consumer_group = ? AND status = 'delivered'", "frozen", relay.DefaultGroup)
			}
			waitFor(t, "some events relayed", func() bool { return delivered() >= 60 })
			f.proxy.freeze()
			time.Sleep(200 * time.Millisecond) // publishes go on, their acks wait
			var runErr error
			took := within(t, 40*time.Second, "the relay's Run after its context ended", func() {
				stop()
				runErr = <-done
			})
			t.Logf("Run returned after %s (%v); %d events delivered before; %d lines logged", took, runErr, delivered(), strings.Count(logs.String(), "\n"))
			if limit := 20 * time.Second; took > limit {
				t.Fatalf("Run took %s to return while the database did not answer, want at most %s", took, limit)
			}
			f.proxy.unfreeze()

			// A new relay, straight to the database, finishes the job.
			r2, err := relay.NewJetStream(ctx, f.s, nc, cfg)
			if err != nil {
				t.Fatal(err)
			}
			runCtx2, stop2 := context.WithCancel(ctx)
			done2 := make(chan error, 1)
			go func() { done2 <- r2.Run(runCtx2) }()
			deadline := time.Now().Add(30 * time.Second)
			for delivered() < n && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			stop2()
			if err := <-done2; err != nil {
				t.Fatalf("second relay: %v", err)
			}
			if got := delivered(); got != n {
				t.Fatalf("%d of %d events delivered after the database answered again", got, n)
			}
			msgs := testnats.Messages(t, st)
			seen := map[string]int{}
			for _, m := range msgs {
				seen[m.Header.Get(relay.HeaderKey)]++
			}
			dups := 0
			for _, c := range seen {
				dups += c - 1
			}
			if len(msgs) != n || len(seen) != n || dups != 0 {
				t.Fatalf("the stream holds %d messages of %d events (%d repeats), want each of %d once", len(msgs), len(seen), dups, n)
			}
			// The logs of the stop and the recovery name no event.
			if out := logs.String(); strings.Contains(out, "ev-") || strings.Contains(out, "key-") {
				t.Fatalf("the relay's logs hold an event key or ordering key:\n%s", out)
			}
		})
	}
}
