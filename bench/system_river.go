package main

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

func init() {
	register(systemInfo{
		name:  "river",
		label: "river (FetchCooldown 1ms)",
		notes: "river.Client.InsertTx in the producer transaction; MaxWorkers = -workers on one queue; FetchCooldown 1ms, FetchPollInterval 50ms; LISTEN/NOTIFY on; River records completions asynchronously in batches, so a job counts as handled slightly before its completed state is committed",
		order: 20,
		new: func(o Options) System {
			return &riverSystem{workers: o.Workers, fetchCooldown: time.Millisecond, fetchPollInterval: 50 * time.Millisecond}
		},
	})
	register(systemInfo{
		name:  "river-default",
		label: "river (defaults)",
		notes: "as river, but FetchCooldown and FetchPollInterval left at river's defaults (100ms / 1s)",
		order: 21,
		new:   func(o Options) System { return &riverSystem{workers: o.Workers} },
	})
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
	w.handler(job.Args.Payload)
	return nil
}

// riverSystem runs River with the pgx v5 driver. Zero fetch settings mean
// River's defaults.
type riverSystem struct {
	workers           int
	fetchCooldown     time.Duration
	fetchPollInterval time.Duration

	pool   *pgxpool.Pool
	worker *riverWorker
	client *river.Client[pgx.Tx]
}

func (s *riverSystem) Setup(ctx context.Context, pool *pgxpool.Pool) error {
	s.pool = pool
	driver := riverpgxv5.New(pool)
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
	_, err := s.pool.Exec(ctx, `TRUNCATE river_job, river_leader, river_queue RESTART IDENTITY`)
	return err
}

func (s *riverSystem) Prefill(ctx context.Context, n int) error {
	_, err := s.pool.Exec(ctx, `
		INSERT INTO river_job (args, kind, max_attempts, queue, state, attempt, attempted_at, finalized_at)
		SELECT jsonb_build_object('payload', jsonb_build_object('id', -g, 'pad', repeat('x', 180))),
		       'bench_event', 25, 'default', 'completed', 1, now(), now()
		FROM generate_series(1, $1) AS g`, n)
	if err != nil {
		return err
	}
	_, err = s.pool.Exec(ctx, `VACUUM (ANALYZE) river_job`)
	return err
}

func (s *riverSystem) Enqueue(ctx context.Context, tx pgx.Tx, payload []byte) error {
	_, err := s.client.InsertTx(ctx, tx, riverArgs{Payload: payload}, nil)
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
