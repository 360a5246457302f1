package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

func init() {
	register(systemInfo{
		name:     "raw",
		label:    "raw SQL lease-claim loop",
		notes:    "one row per claim (PostgreSQL: UPDATE ... WHERE id = (SELECT ... FOR UPDATE SKIP LOCKED LIMIT 1) RETURNING; SQLite: UPDATE ... WHERE id = (SELECT ... LIMIT 1) RETURNING), separate ack UPDATE, 30 s lease, 50 ms idle poll",
		order:    10,
		dialects: []string{dialectPostgres, dialectSQLite},
		new:      func(o Options) System { return &rawSystem{workers: o.Workers} },
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

	db     *database
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func (s *rawSystem) Setup(ctx context.Context, db *database) error {
	s.db = db
	switch db.dialect {
	case dialectPostgres:
		return db.execAll(ctx, `DROP TABLE IF EXISTS raw_queue`, `
		CREATE TABLE raw_queue (
			id           bigserial PRIMARY KEY,
			payload      bytea NOT NULL,
			status       text NOT NULL DEFAULT 'pending',
			locked_until timestamptz NOT NULL DEFAULT '-infinity',
			attempts     int NOT NULL DEFAULT 0,
			created_at   timestamptz NOT NULL DEFAULT now(),
			done_at      timestamptz
		)`, `CREATE INDEX raw_queue_undone ON raw_queue (id) WHERE status <> 'done'`)
	default:
		return db.execAll(ctx, `DROP TABLE IF EXISTS raw_queue`, `
		CREATE TABLE raw_queue (
			id           INTEGER PRIMARY KEY,
			payload      BLOB NOT NULL,
			status       TEXT NOT NULL DEFAULT 'pending',
			locked_until INTEGER NOT NULL DEFAULT 0,
			attempts     INTEGER NOT NULL DEFAULT 0,
			created_at   INTEGER NOT NULL DEFAULT (unixepoch()),
			done_at      INTEGER
		)`, `CREATE INDEX raw_queue_undone ON raw_queue (id) WHERE status <> 'done'`)
	}
}

func (s *rawSystem) Reset(ctx context.Context) error {
	return s.db.truncate(ctx, "raw_queue")
}

func (s *rawSystem) Prefill(ctx context.Context, n int) error {
	if s.db.dialect != dialectPostgres {
		return errors.New("prefill is implemented for PostgreSQL only")
	}
	err := s.db.exec(ctx, `
		INSERT INTO raw_queue (payload, status, attempts, done_at)
		SELECT convert_to(repeat('x', 200), 'UTF8'), 'done', 1, now()
		FROM generate_series(1, $1)`, n)
	if err != nil {
		return err
	}
	return s.db.exec(ctx, `VACUUM (ANALYZE) raw_queue`)
}

func (s *rawSystem) Enqueue(ctx context.Context, tx *benchTx, payload []byte) error {
	return tx.exec(ctx, `INSERT INTO raw_queue (payload) VALUES (`+tx.d.ph(1)+`)`, payload)
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
		id, payload, err := s.claim(ctx)
		if errors.Is(err, pgx.ErrNoRows) || errors.Is(err, sql.ErrNoRows) {
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
		handler.handle(payload)
		if err := s.ack(ctx, id); err != nil && ctx.Err() == nil {
			logf("raw: ack %d: %v", id, err)
		}
	}
}

// claim leases the oldest claimable row.
func (s *rawSystem) claim(ctx context.Context) (id int64, payload []byte, err error) {
	now := time.Now().UnixMicro()
	switch s.db.dialect {
	case dialectPostgres:
		err = s.db.pool.QueryRow(ctx, `
			UPDATE raw_queue
			SET status = 'leased', locked_until = now() + $1::interval, attempts = attempts + 1
			WHERE id = (
				SELECT id FROM raw_queue
				WHERE status <> 'done' AND locked_until < now()
				ORDER BY id
				LIMIT 1
				FOR UPDATE SKIP LOCKED)
			RETURNING id, payload`, rawLease).Scan(&id, &payload)
	default:
		// SQLite has one writer: no locking read needed.
		err = s.db.db.QueryRowContext(ctx, `
			UPDATE raw_queue
			SET status = 'leased', locked_until = ?, attempts = attempts + 1
			WHERE id = (
				SELECT id FROM raw_queue
				WHERE status <> 'done' AND locked_until < ?
				ORDER BY id
				LIMIT 1)
			RETURNING id, payload`, now+rawLease.Microseconds(), now).Scan(&id, &payload)
	}
	return id, payload, err
}

// ack marks a claimed row done.
func (s *rawSystem) ack(ctx context.Context, id int64) error {
	if s.db.dialect == dialectPostgres {
		return s.db.exec(ctx, `UPDATE raw_queue SET status = 'done', done_at = now() WHERE id = $1`, id)
	}
	return s.db.exec(ctx, `UPDATE raw_queue SET status = 'done', done_at = ? WHERE id = ?`, time.Now().UnixMicro(), id)
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
