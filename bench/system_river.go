package main

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

func init() {
	type variant struct {
		name, label, notes string
		maxWorkers         int // 0: -workers
		cooldown, poll     time.Duration
		extra              bool
	}
	for i, v := range []variant{
		{name: "river", label: "river (MaxWorkers 8, FetchCooldown 1 ms, FetchPollInterval 50 ms)",
			notes: "MaxWorkers = -workers", cooldown: time.Millisecond, poll: 50 * time.Millisecond},
		{name: "river-100", label: "river (MaxWorkers 100, FetchCooldown 1 ms, FetchPollInterval 20 ms)",
			maxWorkers: 100, cooldown: time.Millisecond, poll: 20 * time.Millisecond},
		{name: "river-1000", label: "river (MaxWorkers 1000, FetchCooldown 1 ms, FetchPollInterval 20 ms)",
			maxWorkers: 1000, cooldown: time.Millisecond, poll: 20 * time.Millisecond},
		{name: "river-bench", label: "river, its own benchmark's settings (MaxWorkers 2000, FetchCooldown 2 ms, FetchPollInterval 20 ms)",
			notes: "the settings of river's own benchmark command (riverbench)", maxWorkers: 2000, cooldown: 2 * time.Millisecond, poll: 20 * time.Millisecond},
		{name: "river-default", label: "river defaults (MaxWorkers 100, FetchCooldown 100 ms, FetchPollInterval 1 s)",
			notes: "MaxWorkers 100 as in river's getting-started example, fetch settings left at river's defaults", maxWorkers: 100},
	} {
		notes := "river.Client.InsertTx in the producer transaction; one queue; LISTEN/NOTIFY on; river records completions asynchronously in batches, so a job counts as handled slightly before its completed state is committed"
		if v.notes != "" {
			notes = v.notes + "; " + notes
		}
		register(systemInfo{
			name: v.name, label: v.label, notes: notes, order: 20 + i, extra: v.extra,
			new: func(o Options) System {
				workers := v.maxWorkers
				if workers == 0 {
					workers = o.Workers
				}
				return &riverSystem{workers: workers, fetchCooldown: v.cooldown, fetchPollInterval: v.poll}
			},
		})
	}
}

// riverArgs is the job args type; the benchmark payload is carried verbatim.
type riverArgs struct {
	Payload json.RawMessage `json:"payload"`
}

// Kind implements river.JobArgs.
func (riverArgs) Kind() string { return "bench_event" }

// riverWorker hands each job's payload to the benchmark handler.
type riverWorker struct {
	river.WorkerDefaults[riverArgs]
	handler Handler
}

// Work implements river.Worker.
func (w *riverWorker) Work(_ context.Context, job *river.Job[riverArgs]) error {
	w.handler.handle(job.Args.Payload)
	return nil
}

// riverSystem runs River with the pgx v5 driver. Zero fetch settings mean
// River's defaults.
type riverSystem struct {
	workers           int
	fetchCooldown     time.Duration
	fetchPollInterval time.Duration

	db     *database
	worker *riverWorker
	client *river.Client[pgx.Tx]
}

func (s *riverSystem) Setup(ctx context.Context, db *database) error {
	s.db = db
	driver := riverpgxv5.New(db.pool)
	migrator, err := rivermigrate.New(driver, &rivermigrate.Config{Logger: quietLogger()})
	if err != nil {
		return err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return err
	}

	// The client must exist before the enqueue phase (InsertTx needs it)
	// but is only started in Start, so the handler is filled in later.
	s.worker = &riverWorker{}
	workers := river.NewWorkers()
	river.AddWorker(workers, s.worker)
	s.client, err = river.NewClient(driver, &river.Config{
		FetchCooldown:     s.fetchCooldown,
		FetchPollInterval: s.fetchPollInterval,
		Logger:            quietLogger(),
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: s.workers}},
		Workers:           workers,
	})
	return err
}

func (s *riverSystem) Reset(ctx context.Context) error {
	return s.db.truncate(ctx, "river_job", "river_leader", "river_queue")
}

func (s *riverSystem) Prefill(ctx context.Context, n int) error {
	err := s.db.exec(ctx, `
		INSERT INTO river_job (args, kind, max_attempts, queue, state, attempt, attempted_at, finalized_at)
		SELECT jsonb_build_object('payload', jsonb_build_object('id', -g, 'pad', repeat('x', 180))),
		       'bench_event', 25, 'default', 'completed', 1, now(), now()
		FROM generate_series(1, $1) AS g`, n)
	if err != nil {
		return err
	}
	return s.db.exec(ctx, `VACUUM (ANALYZE) river_job`)
}

func (s *riverSystem) Enqueue(ctx context.Context, tx *benchTx, payload []byte) error {
	_, err := s.client.InsertTx(ctx, tx.pgx, riverArgs{Payload: payload}, nil)
	return err
}

func (s *riverSystem) Start(ctx context.Context, handler Handler) error {
	s.worker.handler = handler
	return s.client.Start(ctx)
}

func (s *riverSystem) Stop(ctx context.Context) error {
	if s.client == nil {
		return errors.New("river: not set up")
	}
	return s.client.Stop(ctx)
}

// quietLogger returns a logger that drops everything below warnings.
func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}
