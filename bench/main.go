// Command bench runs the same transactional-outbox workload against several
// queue/outbox systems on one database (PostgreSQL, MySQL/MariaDB or SQLite)
// in one run and prints a markdown report of enqueue cost, delivery
// throughput, commit-to-handler latency and fan-out storage, with ratios
// against baselines measured in the same run and the project's targets.
//
// Usage:
//
//	go run . -events 20000 -out results-postgres.md
//	go run . -db mysql://root@127.0.0.1:3306/test -out results-mysql.md
//	go run . -db sqlite:bench.db -out results-sqlite.md
//	go run . -enqueue-breakdown -events 28000 -out enqueue-breakdown.md
//	go run . -claim-cost -out claim-cost.md
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// config holds the command-line settings.
type config struct {
	dsn            string
	sqliteDirect   bool
	events         int
	producers      int
	workers        int
	rate           int
	latencySeconds int
	systems        []string
	prefill        int
	out            string
	phaseTimeout   time.Duration
	breakdown      bool
	relay          bool
	natsURL        string
	relayRuns      int
	relaySystems   string
	relayWindows   string
	relayPollClock bool
	relayDelete    bool
	claimCost      bool
	claimEvents    int
	claimKeys      int
	fanoutEvents   int
	fanoutRuns     int
	dialect        string
}

func main() {
	var cfg config
	var systems string
	const defaultDB = "postgres://postgres@127.0.0.1:5432/millpond_bench?sslmode=disable"
	flag.StringVar(&cfg.dsn, "db", defaultDB,
		"database: postgres://… (created if missing, via the \"test\" database), mysql://… or sqlite:path")
	flag.StringVar(&cfg.dsn, "dsn", defaultDB, "same as -db")
	flag.IntVar(&cfg.events, "events", 20000, "events to enqueue and then deliver in the throughput phases")
	flag.IntVar(&cfg.producers, "producers", 8, "concurrent producer transactions")
	flag.IntVar(&cfg.workers, "workers", 8, "concurrent consumers per system")
	flag.IntVar(&cfg.rate, "rate", 200, "events per second offered in the latency phase")
	flag.IntVar(&cfg.latencySeconds, "latency-seconds", 10, "duration of the latency phase")
	flag.StringVar(&systems, "systems", "",
		"comma-separated systems to run, a system named several times runs several times (default: every system of the dialect but the extra variants); known: "+strings.Join(registeredNames(), ", "))
	flag.IntVar(&cfg.fanoutEvents, "fanout-events", 5000, "events per fan-out measurement (0 skips the fan-out section)")
	flag.IntVar(&cfg.fanoutRuns, "fanout-runs", 2, "fan-out delivery runs per system (interleaved)")
	flag.IntVar(&cfg.prefill, "prefill", 0, "already-delivered rows to put in each system's table before measuring")
	flag.StringVar(&cfg.out, "out", "", "also write the markdown report to this file")
	flag.DurationVar(&cfg.phaseTimeout, "phase-timeout", 5*time.Minute, "give up on a delivery or latency phase after this long")
	flag.BoolVar(&cfg.breakdown, "enqueue-breakdown", false,
		"instead of the systems, measure what each duty of millpond's enqueue statement costs against the raw INSERT")
	flag.BoolVar(&cfg.relay, "relay", false,
		"measure relaying to NATS JetStream instead: millpond's relay, Watermill's forwarder, a bare async publish loop (PostgreSQL)")
	flag.StringVar(&cfg.natsURL, "nats", "nats://127.0.0.1:4222", "NATS JetStream server for -relay")
	flag.IntVar(&cfg.relayRuns, "relay-runs", 3, "interleaved runs per system in -relay mode")
	flag.StringVar(&cfg.relaySystems, "relay-systems", "bare,relay,relay-leases,forwarder", "systems of -relay mode, comma-separated: bare, relay, relay-leases, forwarder")
	flag.BoolVar(&cfg.relayPollClock, "relay-poll-clock", false,
		"-relay mode: stop the relay's clock when polling the stream's info (every 2 ms, while it runs) finds every event, instead of at its last PubAck (the bare loop's criterion)")
	flag.BoolVar(&cfg.relayDelete, "relay-delete-on-ack", false,
		"-relay mode: the store deletes acknowledged delivery rows (outbox.WithDeleteOnAck) instead of marking them delivered")
	flag.StringVar(&cfg.relayWindows, "relay-windows", "256,1000", "publish windows (most unconfirmed publishes) of -relay mode's bare loop and relay, comma-separated")
	flag.BoolVar(&cfg.claimCost, "claim-cost", false,
		"instead of the systems, time claims on streams holding backlogs blocked behind ordering keys")
	flag.IntVar(&cfg.claimEvents, "claim-events", 100_000, "events of the ordered claim-cost stream")
	flag.IntVar(&cfg.claimKeys, "claim-keys", 1000, "ordering keys of the ordered claim-cost stream")
	sqliteProducers := flag.String("sqlite-producers", "intx",
		"SQLite: how producer transactions (every system's and the raw INSERT baseline's alike) wait for the single writer: intx (outbox.Store.InTx, the store's in-process write queue) or direct (BEGIN IMMEDIATE on the *sql.DB, waiting in SQLite's busy handler)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.Parse()
	switch *sqliteProducers {
	case "intx":
	case "direct":
		cfg.sqliteDirect = true
	default:
		fmt.Fprintf(os.Stderr, "-sqlite-producers: want intx or direct, got %q\n", *sqliteProducers)
		os.Exit(2)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	dialect, err := dialectOf(cfg.dsn)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	cfg.dialect = dialect
	if systems == "" {
		systems = strings.Join(defaultSystems(dialect), ",")
	}
	for _, s := range strings.Split(systems, ",") {
		if s = strings.TrimSpace(s); s != "" {
			cfg.systems = append(cfg.systems, s)
		}
	}
	if err := cfg.validate(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// defaultSystems is every registered system of the dialect except the
// variants that only duplicate another's measurement with a different knob.
func defaultSystems(dialect string) []string {
	var names []string
	for _, n := range registeredNames() {
		if info := registry[n]; info.runsOn(dialect) && !info.extra {
			names = append(names, n)
		}
	}
	return names
}

func (c config) validate() error {
	switch {
	case c.events < 1, c.producers < 1, c.workers < 1, c.rate < 1, c.latencySeconds < 0, c.prefill < 0:
		return fmt.Errorf("-events, -producers, -workers and -rate must be positive; -latency-seconds and -prefill non-negative")
	case len(c.systems) == 0:
		return fmt.Errorf("no systems selected")
	}
	for _, s := range c.systems {
		info, ok := registry[s]
		if !ok {
			return fmt.Errorf("unknown system %q (known: %s)", s, strings.Join(registeredNames(), ", "))
		}
		if !info.runsOn(c.dialect) {
			return fmt.Errorf("system %q does not run on %s", s, c.dialect)
		}
	}
	if c.relay && (c.dialect != dialectPostgres || c.relayRuns < 1) {
		return fmt.Errorf("-relay is implemented for PostgreSQL only, with -relay-runs ≥ 1")
	}
	if c.claimCost && (c.claimEvents < 1 || c.claimKeys < 1) {
		return fmt.Errorf("-claim-events and -claim-keys must be positive")
	}
	if c.breakdown && c.dialect != dialectPostgres {
		return fmt.Errorf("-enqueue-breakdown is implemented for PostgreSQL only")
	}
	return nil
}

func run(ctx context.Context, cfg config) error {
	// Producers, consumers, and headroom for systems' own connections
	// (listeners, leader election, maintenance, the bus's subscribers).
	db, err := openDatabase(ctx, cfg.dsn, cfg.producers+2*cfg.workers+16)
	if err != nil {
		return err
	}
	defer db.close()
	if db.dialect == dialectSQLite && !cfg.sqliteDirect {
		if err := db.queueProducers(); err != nil {
			return err
		}
	}

	env, err := db.describe(ctx)
	if err != nil {
		return err
	}
	if err := db.createBaseTables(ctx); err != nil {
		return err
	}

	if cfg.breakdown {
		return runBreakdown(ctx, db, cfg, env)
	}
	if cfg.relay {
		return runRelayBench(ctx, db, cfg, env)
	}
	if cfg.claimCost {
		return runClaimCost(ctx, db, cfg, env)
	}
	rep := report{cfg: cfg, env: env, dialect: db.dialect, started: time.Now()}
	for _, name := range cfg.systems {
		info := registry[name]
		logf("%s: starting", name)
		res := runSystem(ctx, db, cfg, info)
		if res.err != nil {
			logf("%s: %v", name, res.err)
		}
		rep.baselines = append(rep.baselines, res.roundBaselines...)
		rep.results = append(rep.results, res)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	if cfg.fanoutEvents > 0 {
		rep.fanout, rep.fanoutDelivery = runFanout(ctx, db, cfg)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	rep.finished = time.Now()

	md := rep.markdown()
	return emit(md, cfg.out)
}

// emit prints the markdown report and, when out is set, writes it there.
func emit(md, out string) error {
	fmt.Print(md)
	if out == "" {
		return nil
	}
	if err := os.WriteFile(out, []byte(md), 0o644); err != nil {
		return err
	}
	logf("wrote %s", out)
	return nil
}

// enqueueRounds is how many baseline/system slices the enqueue phase takes.
const enqueueRounds = 5

// measureBaseline returns the enqueue rate of the raw INSERT baseline for n
// events on an empty plain table, with the same producers and transaction
// shape as the systems' enqueue phase.
func measureBaseline(ctx context.Context, db *database, producers, n int) (float64, error) {
	if err := quiesce(ctx, db, "bench_plain_events"); err != nil {
		return 0, err
	}
	elapsed, err := runProducers(ctx, db, producers, rawInsertEnqueue, 1, n, nil, nil)
	if err != nil {
		return 0, err
	}
	return float64(n) / elapsed.Seconds(), nil
}

// median returns the median of xs (which it sorts).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	sort.Float64s(xs)
	if len(xs)%2 == 1 {
		return xs[len(xs)/2]
	}
	return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
}

// quiesce empties the given tables and checkpoints so every measurement
// starts from the same state.
func quiesce(ctx context.Context, db *database, tables ...string) error {
	if err := db.truncate(ctx, tables...); err != nil {
		return err
	}
	return db.checkpoint(ctx)
}

// result is one system's measurements.
type result struct {
	info           systemInfo
	roundBaselines []float64 // raw INSERT rates of the slices interleaved with this system's
	enqueueRate    float64
	enqueueCost    float64   // median of the per-slice ratios raw rate ÷ system rate
	enqueueRatios  []float64 // the per-slice ratios, sorted
	deliverRate    float64
	deliverDone    bool
	firstHandled   time.Duration // from calling Start to the first event handled
	goCPU, dbCPU   time.Duration // CPU of the bench process and of the database's backends in the delivery phase
	delivered      int64         // distinct events handled in the delivery phase
	latencyEvents  int
	latencies      []time.Duration
	offeredRate    float64 // latency-phase commits per second actually achieved
	duplicates     int64
	unknown        int64
	err            error
}

// runSystem takes one system through setup, enqueue, delivery and latency
// phases. Errors are recorded in the result so later systems still run.
func runSystem(ctx context.Context, db *database, cfg config, info systemInfo) (res result) {
	res.info = info
	sys := info.new(Options{Workers: cfg.workers})
	if res.err = sys.Setup(ctx, db); res.err != nil {
		res.err = fmt.Errorf("setup: %w", res.err)
		return res
	}
	if res.err = sys.Reset(ctx); res.err != nil {
		res.err = fmt.Errorf("reset: %w", res.err)
		return res
	}
	prefill := cfg.prefill
	if info.prefill > 0 {
		prefill = info.prefill
	}
	if prefill > 0 {
		logf("%s: prefilling %d delivered rows", info.name, prefill)
		if res.err = sys.Prefill(ctx, prefill); res.err != nil {
			res.err = fmt.Errorf("prefill: %w", res.err)
			return res
		}
	}
	if res.err = quiesce(ctx, db, "bench_orders"); res.err != nil {
		return res
	}

	n := cfg.events
	res.latencyEvents = cfg.rate * cfg.latencySeconds
	t := newTracker(n + res.latencyEvents)

	// 1. Enqueue phase: no consumers running. The n events are enqueued in
	// enqueueRounds slices, each right after a raw INSERT baseline slice of
	// the same size, and the cost is the median of the per-slice ratios:
	// on a shared machine adjacent measurements are what compare fairly.
	var sysTime time.Duration
	var ratios []float64
	for round, first := 0, 1; first <= n; round++ {
		size := min(n/enqueueRounds+1, n-first+1)
		baseRate, err := measureBaseline(ctx, db, cfg.producers, size)
		if err != nil {
			res.err = fmt.Errorf("enqueue phase: baseline: %w", err)
			return res
		}
		if err := db.checkpoint(ctx); err != nil {
			res.err = err
			return res
		}
		elapsed, err := runProducers(ctx, db, cfg.producers, sys.Enqueue, int64(first), size, nil, nil)
		if err != nil {
			res.err = fmt.Errorf("enqueue phase: %w", err)
			return res
		}
		sysTime += elapsed
		ratios = append(ratios, baseRate/(float64(size)/elapsed.Seconds()))
		res.roundBaselines = append(res.roundBaselines, baseRate)
		first += size
	}
	res.enqueueRate = float64(n) / sysTime.Seconds()
	res.enqueueCost = median(ratios)
	res.enqueueRatios = ratios
	logf("%s: enqueue %.0f ev/s, cost %.2fx raw INSERT (rounds %.2f)", info.name, res.enqueueRate, res.enqueueCost, ratios)

	// 2. Delivery phase: from Start until the last of the n events has been
	// handled once.
	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	var mem0, mem1 runtime.MemStats
	runtime.ReadMemStats(&mem0)
	cpuBefore := sampleCPU(ctx, db)
	start := t.now()
	// Goroutines started here carry the label, so a CPU profile of the
	// delivery phase alone is `go tool pprof -tagfocus phase=deliver`.
	var startErr error
	pprof.Do(runCtx, pprof.Labels("phase", "deliver", "system", info.name), func(runCtx context.Context) {
		startErr = sys.Start(runCtx, t)
	})
	if err := startErr; err != nil {
		res.err = fmt.Errorf("start: %w", err)
		return res
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := sys.Stop(stopCtx); err != nil && res.err == nil {
			res.err = fmt.Errorf("stop: %w", err)
		}
		res.duplicates = t.total.Load() - t.distinct.Load()
		res.unknown = t.unknown.Load()
	}()
	res.deliverDone = t.waitDistinct(ctx, int64(n), cfg.phaseTimeout)
	res.delivered = t.distinct.Load()
	if !res.deliverDone {
		res.err = fmt.Errorf("delivery phase: only %d of %d events handled within %s", res.delivered, n, cfg.phaseTimeout)
		return res
	}
	cpu := sampleCPU(ctx, db).sub(cpuBefore)
	runtime.ReadMemStats(&mem1)
	res.goCPU, res.dbCPU = cpu.client, cpu.db
	res.deliverRate = float64(n) / (t.lastFirstSeen(1, n) - time.Duration(start)).Seconds()
	res.firstHandled = t.firstFirstSeen(1, n) - time.Duration(start)
	// Allocations and GC cycles do not depend on the machine's load, unlike
	// CPU time.
	logf("%s: deliver %.0f ev/s (first event handled %s after Start was called); CPU per event: bench process %.1f µs, database %.1f µs; "+
		"bench process per event: %.1f allocations, %.0f bytes, %.2f voluntary context switches; %d GC cycles",
		info.name, res.deliverRate, res.firstHandled.Round(time.Millisecond),
		float64(res.goCPU.Microseconds())/float64(n), float64(res.dbCPU.Microseconds())/float64(n),
		float64(mem1.Mallocs-mem0.Mallocs)/float64(n), float64(mem1.TotalAlloc-mem0.TotalAlloc)/float64(n), float64(cpu.sleeps)/float64(n), mem1.NumGC-mem0.NumGC)

	// 3. Latency phase: consumers keep running; producers offer a fixed
	// rate and each event's commit-to-handle time is recorded.
	if res.latencyEvents > 0 {
		first := int64(n + 1)
		elapsed, err := runProducers(ctx, db, cfg.producers, sys.Enqueue, first, res.latencyEvents,
			paced(ctx, first, res.latencyEvents, cfg.rate), t.markCommitted)
		if err != nil {
			res.err = fmt.Errorf("latency phase: %w", err)
			return res
		}
		res.offeredRate = float64(res.latencyEvents) / elapsed.Seconds()
		if !t.waitDistinct(ctx, int64(n+res.latencyEvents), cfg.phaseTimeout) {
			res.err = fmt.Errorf("latency phase: only %d of %d events handled within %s",
				t.distinct.Load()-int64(n), res.latencyEvents, cfg.phaseTimeout)
		}
		res.latencies = t.latencies(first, res.latencyEvents)
		logf("%s: latency p50 %s p99 %s", info.name,
			percentile(res.latencies, 50), percentile(res.latencies, 99))
	}
	// Give late redeliveries a moment to show up as duplicates.
	sleep(ctx, 500*time.Millisecond)
	return res
}

// ensureDatabase creates the DSN's database if it does not exist, connecting
// through the "test" database to do so.
func ensureDatabase(ctx context.Context, dsn string) error {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return err
	}
	name := cfg.Database
	cfg.Database = "test"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect to test database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		return err
	}
	if exists {
		return nil
	}
	logf("creating database %s", name)
	_, err = conn.Exec(ctx, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize())
	return err
}

// logf prints a progress line to stderr.
func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
}
