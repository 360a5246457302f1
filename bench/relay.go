package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/relay"
)

// The -relay mode measures how fast events committed in the outbox reach a
// NATS JetStream stream, three ways, on the same events (unordered, ~200-byte
// JSON payloads), each on a fresh file-backed stream (same settings), runs
// interleaved; -relay-systems picks them, -relay-windows the windows:
//
//   - bare: a loop of asynchronous JetStream publishes (PublishMsgAsync, no
//     options) of the same messages (subject, Nats-Msg-Id, headers,
//     payload), built in memory before the clock starts, at most `window`
//     unconfirmed (the client's WithPublishAsyncMaxPending; a publish that
//     stalls on a full window is tried again), until PublishAsyncComplete
//     and the stream holds them: the limit of the broker and the client;
//   - millpond relay: relay.JetStream (the given window, default batch
//     1000; its claims held in transactions, its default on PostgreSQL, or
//     with relay-leases under leases, Config.UseLeases) over events
//     already committed in millpond's outbox, from Run
//     until its last PubAck (its Stats, read every 0.5 ms; then the stream
//     must hold them), the bare loop's criterion; with -relay-poll-clock
//     until polling the stream's info every 2 ms finds them, which costs
//     the client and the server CPU while the relay runs;
//   - Watermill forwarder: watermill-sql v4's publisher in the producer's
//     transaction wrapped by components/forwarder (the envelope on one
//     forwarder topic, default schema), the forwarder's router reading it
//     and publishing through watermill-nats v2's JetStream publisher
//     (synchronous publish, TrackMsgId), until the stream holds them.
//
// Enqueueing is not timed (500 events per transaction before the clock
// starts); the figure is events per second from starting the relay (or
// loop) until the stream holds every event.

const (
	relayBenchTopic   = "bench_relay"
	relayForwardTopic = "bench_forwarder"
)

// relaySubjectPrefix is the first token of every subject the bench
// publishes: one per process, so runs on a shared NATS server create
// streams whose subjects do not overlap.
var relaySubjectPrefix = fmt.Sprintf("benchrelay%d", os.Getpid())

func relayPayload(i int) []byte {
	return fmt.Appendf(nil, `{"order_id":%d,"customer":"c-%d","lines":[{"sku":"sku-1","qty":2,"price":1999},{"sku":"sku-2","qty":1,"price":4999}],"pad":"%s"}`,
		i, i%977, strings.Repeat("x", 80))
}

func runRelayBench(ctx context.Context, db *database, cfg config, env string) error {
	nc, err := nats.Connect(cfg.natsURL)
	if err != nil {
		return fmt.Errorf("-nats %s: %w", relay.RedactURL(cfg.natsURL), err)
	}
	defer nc.Close()
	storeOpts := []outbox.Option{outbox.WithoutListen()}
	if cfg.relayDelete {
		storeOpts = append(storeOpts, outbox.WithDeleteOnAck())
	}
	store, err := db.store(storeOpts...)
	if err != nil {
		return err
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	admin, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	var windows []int
	for w := range strings.SplitSeq(cfg.relayWindows, ",") {
		var n int
		if _, err := fmt.Sscan(strings.TrimSpace(w), &n); err != nil || n < 1 {
			return fmt.Errorf("-relay-windows: %q is not a window", w)
		}
		windows = append(windows, n)
	}
	want := map[string]bool{}
	for s := range strings.SplitSeq(cfg.relaySystems, ",") {
		switch s = strings.TrimSpace(s); s {
		case "bare", "relay", "relay-leases", "forwarder":
			want[s] = true
		default:
			return fmt.Errorf("-relay-systems: unknown system %q (bare, relay, relay-leases, forwarder)", s)
		}
	}
	type system struct {
		name, kind string
		run        func(context.Context, jetstream.Stream) (float64, cpuTimes, error)
	}
	var systems []system
	for _, w := range windows {
		if want["bare"] {
			// Its own JetStream context, so its pending limit is w.
			js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(w))
			if err != nil {
				return err
			}
			systems = append(systems, system{fmt.Sprintf("bare async JetStream publish loop (window %d)", w), "bare", func(ctx context.Context, st jetstream.Stream) (float64, cpuTimes, error) {
				return benchBare(ctx, db, js, st, cfg.events)
			}})
		}
		if want["relay"] && w <= outbox.MaxBatch { // the relay's window is at most outbox.MaxBatch
			systems = append(systems, system{fmt.Sprintf("millpond relay, held claims: its default on PostgreSQL (window %d, batch %d)", w, relay.DefaultBatchSize), "relay", func(ctx context.Context, st jetstream.Stream) (float64, cpuTimes, error) {
				return benchRelay(ctx, db, store, nc, st, cfg.events, w, cfg.relayPollClock, false)
			}})
		}
		if want["relay-leases"] && w <= outbox.MaxBatch {
			systems = append(systems, system{fmt.Sprintf("millpond relay, leased claims: `UseLeases` (window %d, batch %d)", w, relay.DefaultBatchSize), "relay-leases", func(ctx context.Context, st jetstream.Stream) (float64, cpuTimes, error) {
				return benchRelay(ctx, db, store, nc, st, cfg.events, w, cfg.relayPollClock, true)
			}})
		}
	}
	if want["forwarder"] {
		systems = append(systems, system{"Watermill forwarder", "forwarder", func(ctx context.Context, st jetstream.Stream) (float64, cpuTimes, error) {
			return benchForwarder(ctx, db, cfg.natsURL, st, cfg.events)
		}})
	}
	rates := make([][]float64, len(systems))
	cpus := make([][]cpuTimes, len(systems))
	for run := range cfg.relayRuns {
		for i, s := range systems {
			name := fmt.Sprintf("BENCH_RELAY_%d", os.Getpid())
			_ = admin.DeleteStream(ctx, name)
			st, err := admin.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{relaySubjectPrefix + ".>"}, Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute})
			if err != nil {
				return err
			}
			if err := db.checkpoint(ctx); err != nil {
				return err
			}
			rate, cpu, err := s.run(ctx, st)
			_ = admin.DeleteStream(ctx, name)
			if err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
			logf("relay run %d: %s: %.0f ev/s; CPU µs/event: client %s, database %s, NATS %s", run+1, s.name, rate,
				perEvent1(cpu.client, cfg.events), perEvent1(cpu.db, cfg.events), perEvent1(cpu.nats, cfg.events))
			rates[i] = append(rates[i], rate)
			cpus[i] = append(cpus[i], cpu)
		}
	}
	med := make([]float64, len(systems))
	best := map[string]float64{}
	for i, s := range systems {
		med[i] = median(append([]float64(nil), rates[i]...))
		best[s.kind] = max(best[s.kind], med[i])
	}
	ratio := func(x, base float64) string {
		if base == 0 {
			return "–"
		}
		return fmt.Sprintf("%.2fx", x/base)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# millpond relay benchmark (postgres → NATS JetStream)\n\nRun %s. %s\n\n", time.Now().UTC().Format(time.RFC3339), env)
	fmt.Fprintf(&b, "%d unordered events of ~200 bytes, one file-backed stream per measurement (duplicate window 2 min); %d interleaved runs, median (range). ", cfg.events, cfg.relayRuns)
	b.WriteString("Bare loop: `PublishMsgAsync` of the relay's messages (same subjects, headers, payloads) from memory, at most `window` unconfirmed (`WithPublishAsyncMaxPending`), then `PublishAsyncComplete`. " +
		"Relay: `relay.JetStream` over the events already committed, from `Run` until the stream holds them all; on PostgreSQL it holds each claimed batch in a transaction until the batch is published (`outbox.Store.ClaimHeld`, its default), or with `UseLeases` claims under leases. The targets use the default (held) rows. Ratios are against the best bare loop and the forwarder.\n\n")
	b.WriteString("CPU µs/event (medians): the bench process (client), the PostgreSQL processes of its database, the NATS server (which may serve others too), from the start of the clock until the system's work is done (the relay's: until Run returned, its last acknowledgements written).\n\n")
	b.WriteString("| system | ev/s | vs best bare loop | vs Watermill forwarder | CPU µs/event client / database / NATS |\n|---|---:|---:|---:|---:|\n")
	for i, s := range systems {
		lo, hi := minMax(rates[i])
		part := func(f func(cpuTimes) time.Duration) string {
			var xs []float64
			for _, c := range cpus[i] {
				if f(c) < 0 {
					return "–"
				}
				xs = append(xs, float64(f(c)))
			}
			return perEvent(time.Duration(median(xs)), cfg.events)
		}
		fmt.Fprintf(&b, "| %s | %.0f (%.0f–%.0f) | %s | %s | %s / %s / %s |\n", s.name, med[i], lo, hi, ratio(med[i], best["bare"]), ratio(med[i], best["forwarder"]),
			part(func(c cpuTimes) time.Duration { return c.client }), part(func(c cpuTimes) time.Duration { return c.db }), part(func(c cpuTimes) time.Duration { return c.nats }))
	}
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "**NOT met**"
	}
	if best["relay"] > 0 && best["forwarder"] > 0 && best["bare"] > 0 {
		fmt.Fprintf(&b, "\nTargets (issue 13), best relay row: relay ≥ 3× the Watermill forwarder: %s, %s; relay ≥ 0.5× the best bare loop: %s, %s\n",
			ratio(best["relay"], best["forwarder"]), verdict(best["relay"] >= 3*best["forwarder"]), ratio(best["relay"], best["bare"]), verdict(best["relay"] >= 0.5*best["bare"]))
	}
	fmt.Print(b.String())
	if cfg.out != "" {
		return os.WriteFile(cfg.out, []byte(b.String()), 0o644)
	}
	return nil
}

func minMax(xs []float64) (lo, hi float64) {
	for i, x := range xs {
		if i == 0 || x < lo {
			lo = x
		}
		if i == 0 || x > hi {
			hi = x
		}
	}
	return lo, hi
}

// relayMsg is the message the relay would publish for event i.
func relayMsg(i int) *nats.Msg {
	key := fmt.Sprintf("ev-%d", i)
	h := nats.Header{}
	h.Set(jetstream.MsgIDHeader, relay.MsgID(relayBenchTopic, key))
	h.Set(relay.HeaderStream, relayBenchTopic)
	h.Set(relay.HeaderKind, "OrderPlaced")
	h.Set(relay.HeaderKey, key)
	return &nats.Msg{Subject: relaySubjectPrefix + "." + relayBenchTopic + ".OrderPlaced", Header: h, Data: relayPayload(i)}
}

// perEvent1 formats a CPU time per event in µs with one decimal ("–" when
// unknown).
func perEvent1(d time.Duration, n int) string {
	if d < 0 || n == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f", float64(d.Nanoseconds())/1e3/float64(n))
}

// perEvent formats a CPU time per event in µs ("–" when unknown).
func perEvent(d time.Duration, n int) string {
	if d < 0 || n == 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f", float64(d.Microseconds())/float64(n))
}

func benchBare(ctx context.Context, db *database, js jetstream.JetStream, st jetstream.Stream, n int) (float64, cpuTimes, error) {
	msgs := make([]*nats.Msg, n)
	for i := range n {
		msgs[i] = relayMsg(i)
	}
	cpu0 := sampleCPU(ctx, db)
	start := time.Now()
	for _, m := range msgs {
		for {
			// A full window stalls the publish for up to 200 ms, then
			// fails it: on a loaded machine, try again.
			_, err := js.PublishMsgAsync(m)
			if errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
				continue
			}
			if err != nil {
				return 0, cpuTimes{}, err
			}
			break
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(5 * time.Minute):
		return 0, cpuTimes{}, fmt.Errorf("async publishes not complete")
	}
	elapsed := time.Since(start)
	cpu := sampleCPU(ctx, db).sub(cpu0)
	return float64(n) / elapsed.Seconds(), cpu, waitStream(ctx, st, n, start)
}

// waitStream waits until the stream holds n messages.
func waitStream(ctx context.Context, st jetstream.Stream, n int, start time.Time) error {
	for {
		info, err := st.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.Msgs >= uint64(n) {
			if info.State.Msgs > uint64(n) {
				return fmt.Errorf("stream holds %d messages, want %d", info.State.Msgs, n)
			}
			return nil
		}
		if time.Since(start) > 5*time.Minute {
			return fmt.Errorf("stream holds %d of %d messages after 5 minutes", info.State.Msgs, n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// waitConfirmed waits until the relay has had n PubAcks, as the bare loop's
// PublishAsyncComplete does: the clock stops there, without asking the
// server for the stream's state every few milliseconds while the relay
// runs (which costs the client and the server CPU the bare loop does not
// spend).
func waitConfirmed(ctx context.Context, r *relay.JetStream, n int, start time.Time) error {
	for {
		s := r.Stats()
		if s.Published+s.Duplicates >= int64(n) {
			return nil
		}
		if s.Failed > 0 || s.DeadLettered > 0 {
			return fmt.Errorf("relay: %d failed publishes, %d dead letters", s.Failed, s.DeadLettered)
		}
		if time.Since(start) > 5*time.Minute {
			return fmt.Errorf("relay confirmed %d of %d events after 5 minutes", s.Published+s.Duplicates, n)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		time.Sleep(500 * time.Microsecond)
	}
}

// enqueueBatches commits n events, 500 per transaction, through add.
func enqueueBatches(ctx context.Context, db *database, n int, add func(*benchTx, int) error) error {
	for i := 0; i < n; i += 500 {
		tx, err := db.begin(ctx)
		if err != nil {
			return err
		}
		for j := i; j < min(i+500, n); j++ {
			if err := add(tx, j); err != nil {
				tx.rollback(ctx)
				return err
			}
		}
		if err := tx.commit(ctx); err != nil {
			return err
		}
	}
	return nil
}

func benchRelay(ctx context.Context, db *database, store *outbox.Store, nc *nats.Conn, st jetstream.Stream, n, window int, pollClock, useLeases bool) (float64, cpuTimes, error) {
	if err := db.truncate(ctx, "millpond_outbox", "millpond_ordering"); err != nil {
		return 0, cpuTimes{}, err
	}
	if err := store.RegisterGroup(ctx, relayBenchTopic, relay.DefaultGroup); err != nil {
		return 0, cpuTimes{}, err
	}
	err := enqueueBatches(ctx, db, n, func(tx *benchTx, i int) error {
		_, err := store.Enqueue(ctx, tx.outbox(), outbox.Event{Stream: relayBenchTopic, Key: fmt.Sprintf("ev-%d", i), Kind: "OrderPlaced", Payload: relayPayload(i)})
		return err
	})
	if err != nil {
		return 0, cpuTimes{}, err
	}
	if err := db.checkpoint(ctx); err != nil {
		return 0, cpuTimes{}, err
	}
	r, err := relay.NewJetStream(ctx, store, nc, relay.JetStreamConfig{
		Config:        relay.Config{Streams: []string{relayBenchTopic}, Window: window, PollInterval: 5 * time.Millisecond, UseLeases: useLeases},
		SubjectPrefix: relaySubjectPrefix,
	})
	if err != nil {
		return 0, cpuTimes{}, err
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	var mem0, mem1 runtime.MemStats
	runtime.ReadMemStats(&mem0)
	cpu0 := sampleCPU(ctx, db)
	start := time.Now()
	go func() { done <- r.Run(runCtx) }()
	var elapsed time.Duration
	if pollClock {
		err = waitStream(ctx, st, n, start)
		elapsed = time.Since(start)
	} else {
		err = waitConfirmed(ctx, r, n, start)
		elapsed = time.Since(start)
		if err == nil {
			err = waitStream(ctx, st, n, start)
		}
	}
	stop()
	if rerr := <-done; err == nil {
		err = rerr
	}
	cpu := sampleCPU(ctx, db).sub(cpu0)
	runtime.ReadMemStats(&mem1)
	logf("relay: %.1f allocations, %.0f bytes allocated per event, %d GC cycles (client)",
		float64(mem1.Mallocs-mem0.Mallocs)/float64(n), float64(mem1.TotalAlloc-mem0.TotalAlloc)/float64(n), mem1.NumGC-mem0.NumGC)
	return float64(n) / elapsed.Seconds(), cpu, err
}

func benchForwarder(ctx context.Context, db *database, natsURL string, st jetstream.Stream, n int) (float64, cpuTimes, error) {
	logger := watermill.NopLogger{}
	schema := wsql.DefaultPostgreSQLSchema{}
	offsets := wsql.DefaultPostgreSQLOffsetsAdapter{}
	for _, t := range []string{"watermill_" + relayForwardTopic, "watermill_offsets_" + relayForwardTopic} {
		if err := db.exec(ctx, `DROP TABLE IF EXISTS "`+t+`"`); err != nil {
			return 0, cpuTimes{}, err
		}
	}
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromPgx(db.pool), wsql.SubscriberConfig{
		ConsumerGroup: "forwarder", SchemaAdapter: schema, OffsetsAdapter: offsets, PollInterval: 5 * time.Millisecond,
		InitializeSchema: true,
	}, logger)
	if err != nil {
		return 0, cpuTimes{}, err
	}
	if err := sub.SubscribeInitialize(relayForwardTopic); err != nil {
		return 0, cpuTimes{}, err
	}
	err = enqueueBatches(ctx, db, n, func(tx *benchTx, i int) error {
		p, err := wsql.NewPublisher(wsql.TxFromPgx(tx.pgx), wsql.PublisherConfig{SchemaAdapter: schema}, logger)
		if err != nil {
			return err
		}
		fp := forwarder.NewPublisher(p, forwarder.PublisherConfig{ForwarderTopic: relayForwardTopic})
		m := message.NewMessage(fmt.Sprintf("ev-%d", i), relayPayload(i))
		m.Metadata.Set("event_kind", "OrderPlaced")
		return fp.Publish(relaySubjectPrefix+"."+relayBenchTopic+".OrderPlaced", m)
	})
	if err != nil {
		return 0, cpuTimes{}, err
	}
	if err := db.checkpoint(ctx); err != nil {
		return 0, cpuTimes{}, err
	}
	pub, err := wnats.NewPublisher(wnats.PublisherConfig{
		URL:               natsURL,
		SubjectCalculator: func(_, topic string) *wnats.SubjectDetail { return &wnats.SubjectDetail{Primary: topic} },
		JetStream:         wnats.JetStreamConfig{TrackMsgId: true},
	}, logger)
	if err != nil {
		return 0, cpuTimes{}, err
	}
	defer pub.Close()
	fwd, err := forwarder.NewForwarder(sub, pub, logger, forwarder.Config{ForwarderTopic: relayForwardTopic})
	if err != nil {
		return 0, cpuTimes{}, err
	}
	cpu0 := sampleCPU(ctx, db)
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- fwd.Run(ctx) }()
	err = waitStream(ctx, st, n, start)
	elapsed := time.Since(start)
	_ = fwd.Close()
	<-done
	return float64(n) / elapsed.Seconds(), sampleCPU(ctx, db).sub(cpu0), err
}
