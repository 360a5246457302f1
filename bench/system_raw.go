package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func init() {
	register(systemInfo{
		name:  "raw",
		label: "raw SQL lease-claim loop",
		notes: "one row per claim (UPDATE ... WHERE id = (SELECT ... FOR UPDATE SKIP LOCKED LIMIT 1) RETURNING), separate ack UPDATE, 30 s lease, 50 ms idle poll",
		order: 10,
		new:   func(o Options) System { return &rawSystem{workers: o.Workers} },
	})
}

// rawIdlePoll is how long a raw worker sleeps after finding no work.
const rawIdlePoll = 50 * time.Millisecond

// rawLease is how long a claimed row stays invisible to other workers.
const rawLease = 30 * time.Second

// rawSystem is the hand-written floor: a queue table polled with
// SELECT ... FOR UPDATE SKIP LOCKED, one row per claim.
type rawSystem struct {
	workers int

	pool   *pgxpool.Pool
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func (s *rawSystem) Setup(ctx context.Context, pool *pgxpool.Pool) error {
	s.pool = pool
	_, err := pool.Exec(ctx, `
		DROP TABLE IF EXISTS raw_queue;
		CREATE TABLE raw_queue (
			id           bigserial PRIMARY KEY,
			payload      bytea NOT NULL,
			status       text NOT NULL DEFAULT 'pending',
			locked_until timestamptz NOT NULL DEFAULT '-infinity',
			attempts     int NOT NULL DEFAULT 0,
			created_at   timestamptz NOT NULL DEFAULT now(),
			done_at      timestamptz
		);
		CREATE INDEX raw_queue_undone ON raw_queue (id) WHERE status <> 'done';`)
	return err
}

func (s *rawSystem) Reset(ctx context.Context) error {
	_, err := s.pool.Exec(ctx, `TRUNCATE raw_queue RESTART IDENTITY`)
	return err
}

func (s *rawSystem) Prefill(ctx context.Context, n int) error {
	_, err := s.pool.Exec(ctx, `
		INSERT INTO raw_queue (payload, status, attempts, done_at)
		SELECT convert_to(repeat('x', 200), 'UTF8'), 'done', 1, now()
		FROM generate_series(1, $1)`, n)
	if err != nil {
		return err
	}
	_, err = s.pool.Exec(ctx, `VACUUM (ANALYZE) raw_queue`)
	return err
}

func (s *rawSystem) Enqueue(ctx context.Context, tx pgx.Tx, payload []byte) error {
	_, err := tx.Exec(ctx, `INSERT INTO raw_queue (payload) VALUES ($1)`, payload)
	return err
}

func (s *rawSystem) Start(ctx context.Context, handler Handler) error {
	ctx, s.cancel = context.WithCancel(ctx)
	for range s.workers {
		s.wg.Go(func() { s.work(ctx, handler) })
	}
	return nil
}

func (s *rawSystem) work(ctx context.Context, handler Handler) {
	for ctx.Err() == nil {
		var (
			id      int64
			payload []byte
		)
		err := s.pool.QueryRow(ctx, `
			UPDATE raw_queue
			SET status = 'leased', locked_until = now() + $1::interval, attempts = attempts + 1
			WHERE id = (
				SELECT id FROM raw_queue
				WHERE status <> 'done' AND locked_until < now()
				ORDER BY id
				LIMIT 1
				FOR UPDATE SKIP LOCKED)
			RETURNING id, payload`, rawLease).Scan(&id, &payload)
		if errors.Is(err, pgx.ErrNoRows) {
			sleep(ctx, rawIdlePoll)
			continue
		}
		if err != nil {
			if ctx.Err() == nil {
				logf("raw: claim: %v", err)
				sleep(ctx, rawIdlePoll)
			}
			continue
		}
		handler(payload)
		if _, err := s.pool.Exec(ctx,
			`UPDATE raw_queue SET status = 'done', done_at = now() WHERE id = $1`, id); err != nil && ctx.Err() == nil {
			logf("raw: ack %d: %v", id, err)
		}
	}
}

func (s *rawSystem) Stop(ctx context.Context) error {
	if s.cancel == nil {
		return errors.New("raw: not started")
	}
	s.cancel()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("raw: stop: %w", ctx.Err())
	}
}

// sleep waits for d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
