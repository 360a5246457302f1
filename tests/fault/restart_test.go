package fault

import (
	"github.com/millpond/millpond/outbox/anydb"

	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/millpond/millpond/internal/sqlcore"
	"github.com/millpond/millpond/outbox"
)

// TestPostgresRestartUnderLoad restarts a private PostgreSQL server (fast
// shutdown: every connection is cut) while producers publish through
// NewAutoCommitPublisher and two Subscribers consume. Everything whose
// Publish succeeded must be delivered at least once, and the LISTEN
// connection must come back: a probe event on a topic whose subscriber only
// polls once a minute must arrive within seconds after the restart.
func TestPostgresRestartUnderLoad(t *testing.T) {
	began := time.Now()
	cluster := startPGCluster(t)
	t.Logf("private cluster on port %d ready in %s", cluster.port, time.Since(began).Round(time.Millisecond))
	ctx := context.Background()
	const (
		topic      = "load"
		probeTopic = "probe"
		producers  = 4
	)
	logs := newLogCounter()
	logger := slog.New(logs)
	prodStore, err := anydb.Open(ctx, cluster.URL(), outbox.WithLogger(logger))
	if err != nil {
		t.Fatal(err)
	}
	defer prodStore.Close()
	if err := prodStore.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	consStore, err := anydb.Open(ctx, cluster.URL(), outbox.WithLogger(logger))
	if err != nil {
		t.Fatal(err)
	}
	defer consStore.Close()
	wmLogger := watermill.NewSlogLogger(logger)

	// Consumers: two subscribers of one group, acknowledging everything.
	var mu sync.Mutex
	deliveries := map[string]int{}
	var delivered atomic.Int64
	subCtx, cancelSubs := context.WithCancel(ctx)
	defer cancelSubs()
	var subs []*outbox.Subscriber
	var consumers sync.WaitGroup
	for range 2 {
		sub, err := outbox.NewSubscriber(consStore, outbox.SubscriberConfig{
			BatchSize: 50, MaxInFlight: 8, Lease: 3 * time.Second, PollInterval: 500 * time.Millisecond,
			CloseTimeout: 5 * time.Second, Logger: wmLogger,
		})
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, sub)
		msgs, err := sub.Subscribe(subCtx, topic)
		if err != nil {
			t.Fatal(err)
		}
		consumers.Add(1)
		go func() {
			defer consumers.Done()
			for msg := range msgs {
				mu.Lock()
				deliveries[msg.UUID]++
				mu.Unlock()
				delivered.Add(1)
				msg.Ack()
			}
		}()
	}
	// The probe subscriber polls once a minute: only a NOTIFY wakes it soon.
	probeSub, err := outbox.NewSubscriber(consStore, outbox.SubscriberConfig{PollInterval: time.Minute, Lease: 5 * time.Second, Logger: wmLogger})
	if err != nil {
		t.Fatal(err)
	}
	probes, err := probeSub.Subscribe(subCtx, probeTopic)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // its first claim is done; now it waits for a wake-up

	pub, err := outbox.NewAutoCommitPublisher(prodStore)
	if err != nil {
		t.Fatal(err)
	}
	// publish retries one message until it is stored; the same UUID makes a
	// retry of a commit whose outcome was lost harmless.
	var publishErrs atomic.Int64
	var lastPublishErr atomic.Value
	publish := func(topic string, msg *message.Message) error {
		deadline := time.Now().Add(30 * time.Second)
		for {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			msg.SetContext(pctx)
			err := pub.Publish(topic, msg)
			cancel()
			if err == nil {
				return nil
			}
			publishErrs.Add(1)
			lastPublishErr.Store(err.Error())
			if time.Now().After(deadline) {
				return fmt.Errorf("publish %s: still failing after 30 s: %w", msg.UUID, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	probe := func(label string) time.Duration {
		t.Helper()
		msg := message.NewMessage("probe-"+label, []byte(label))
		sent := time.Now()
		if err := publish(probeTopic, msg); err != nil {
			t.Fatal(err)
		}
		select {
		case m := <-probes:
			m.Ack()
			if m.UUID != msg.UUID {
				t.Fatalf("probe %s: got %s", label, m.UUID)
			}
			return time.Since(sent)
		case <-time.After(20 * time.Second):
			stats, err := prodStore.Stats(ctx)
			t.Fatalf("probe %s not delivered within 20 s: the LISTEN connection did not wake the subscriber (stats %+v, %v; logs: %v)", label, stats, err, logs.snapshot())
			return 0
		}
	}
	if n, err := listeners(ctx, cluster.URL()); err != nil || n != 2 {
		t.Fatalf("%d LISTEN sessions before the restart, want 2 (one per store), err %v", n, err)
	}
	before := probe("before")

	// Producers.
	var published sync.Map // UUID -> restarted (bool): published after the restart began
	var restarted atomic.Bool
	stopProducing := make(chan struct{})
	prodErrs := make(chan error, producers)
	var producing sync.WaitGroup
	for p := range producers {
		producing.Add(1)
		go func() {
			defer producing.Done()
			for i := 0; ; i++ {
				select {
				case <-stopProducing:
					return
				default:
				}
				msg := message.NewMessage(fmt.Sprintf("p%d-%d", p, i), []byte(`{"n":1}`))
				msg.Metadata.Set(outbox.MetadataKind, "LoadEvent")
				if err := publish(topic, msg); err != nil {
					prodErrs <- err
					return
				}
				published.Store(msg.UUID, restarted.Load())
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	count := func() (all, after int) {
		published.Range(func(_, v any) bool {
			all++
			if v.(bool) {
				after++
			}
			return true
		})
		return all, after
	}

	// Let the load settle, then restart under it.
	for start := time.Now(); delivered.Load() < 300 && time.Since(start) < 5*time.Second; {
		time.Sleep(20 * time.Millisecond)
	}
	atRestartPub, _ := count()
	atRestartDel := delivered.Load()
	restarted.Store(true)
	restartBegan := time.Now()
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	err = cluster.restart(rctx)
	cancel()
	if err != nil {
		t.Fatalf("restart: %v", err)
	}
	restartTook := time.Since(restartBegan)
	time.Sleep(1500 * time.Millisecond) // keep producing after the restart
	close(stopProducing)
	producing.Wait()
	close(prodErrs)
	for err := range prodErrs {
		t.Fatalf("producer gave up: %v", err)
	}
	total, after := count()
	if after == 0 {
		t.Fatalf("no publish succeeded after the restart (%d errors, last %v)", publishErrs.Load(), lastPublishErr.Load())
	}

	// Everything published is delivered, eventually, and the database
	// agrees: an event whose ack was lost in the restart is still
	// processing until its lease expires and it is delivered again.
	var missing []string
	var undelivered int64
	drainBegan := time.Now()
	for {
		missing = missing[:0]
		mu.Lock()
		published.Range(func(k, _ any) bool {
			if deliveries[k.(string)] == 0 {
				missing = append(missing, k.(string))
			}
			return true
		})
		mu.Unlock()
		undelivered = -1
		if stats, err := prodStore.Stats(ctx); err == nil {
			undelivered = 0
			for _, s := range stats {
				undelivered += s.Pending + s.Processing + s.Dead
			}
		}
		if len(missing) == 0 && undelivered == 0 || time.Since(drainBegan) > 30*time.Second {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	drained := time.Since(drainBegan)
	// Both stores' LISTEN connections are back: the server is new, so any
	// listener session it has was opened after the restart.
	listenersBack := time.Now()
	for {
		n, err := listeners(ctx, cluster.URL())
		if err == nil && n == 2 {
			break
		}
		if time.Since(listenersBack) > 15*time.Second {
			t.Fatalf("%d LISTEN sessions 15 s after the restart, want 2 (one per store), err %v; logs: %v", n, err, logs.snapshot())
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The first probe after the restart may wait out a subscriber's
	// claim-error backoff (at most 5 s). Then, three seconds after that
	// delivery, the probe subscriber's quick polls (1, 3, 7 ... 4095 ms
	// after its last claim that found an event) are more than a second
	// apart: only NOTIFY can deliver the second probe within 500 ms.
	afterProbe := probe("after")
	time.Sleep(3 * time.Second)
	settledProbe := probe("settled")

	for _, s := range append(subs, probeSub) {
		if err := s.Close(); err != nil {
			t.Errorf("close subscriber: %v", err)
		}
	}
	consumers.Wait()

	mu.Lock()
	dupEvents, dupDeliveries, unknown := 0, 0, 0
	for id, k := range deliveries {
		if k > 1 {
			dupEvents++
			dupDeliveries += k - 1
		}
		if _, ok := published.Load(id); !ok {
			unknown++
		}
	}
	mu.Unlock()
	t.Logf("restart under load: %d published (%d when the restart began, %d after it), %d delivered when it began; pg_ctl restart took %s; %d publish errors retried (last: %v)",
		total, atRestartPub, after, atRestartDel, restartTook.Round(time.Millisecond), publishErrs.Load(), lastPublishErr.Load())
	t.Logf("delivered %d events in %d deliveries: %d events delivered more than once (%d extra deliveries), %d delivered but never reported published; drain took %s after producers stopped",
		len(deliveries), delivered.Load(), dupEvents, dupDeliveries, unknown, drained.Round(time.Millisecond))
	t.Logf("probe latency via NOTIFY (the probe subscriber polls once a minute): %s before the restart, %s and then %s after; logs: %v",
		before.Round(time.Millisecond), afterProbe.Round(time.Millisecond), settledProbe.Round(time.Millisecond), logs.snapshot())
	if len(missing) > 0 {
		sort.Strings(missing)
		t.Fatalf("%d of %d published events never delivered within 30 s: %v", len(missing), total, first(missing, 10))
	}
	if undelivered != 0 {
		t.Fatalf("%d rows still pending, processing or dead 30 s after the producers stopped", undelivered)
	}
	if afterProbe > 12*time.Second || settledProbe > 500*time.Millisecond {
		t.Fatalf("probes after the restart took %s and %s: the subscriber was not woken by NOTIFY", afterProbe, settledProbe)
	}
}

// listeners counts the server's sessions listening for outbox wake-ups:
// the stores name their listener connection "millpond-listener".
func listeners(ctx context.Context, url string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return 0, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(ctx)
	var n int
	err = conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'millpond-listener' AND query = $1",
		"LISTEN "+sqlcore.NotifyChannel).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count listeners: %w", err)
	}
	return n, nil
}

// logCounter is a slog handler that counts records by level and message.
type logCounter struct {
	mu     sync.Mutex
	counts map[string]int
}

func newLogCounter() *logCounter { return &logCounter{counts: map[string]int{}} }

func (l *logCounter) Enabled(context.Context, slog.Level) bool { return true }

func (l *logCounter) Handle(_ context.Context, r slog.Record) error {
	if r.Level < slog.LevelInfo {
		return nil
	}
	l.mu.Lock()
	l.counts[r.Level.String()+" "+r.Message]++
	l.mu.Unlock()
	return nil
}

func (l *logCounter) WithAttrs([]slog.Attr) slog.Handler { return l }

func (l *logCounter) WithGroup(string) slog.Handler { return l }

func (l *logCounter) snapshot() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	keys := make([]string, 0, len(l.counts))
	for k := range l.counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "[%dx %s] ", l.counts[k], k)
	}
	return strings.TrimSpace(b.String())
}
