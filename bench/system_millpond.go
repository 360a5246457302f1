package main

import (
	"github.com/millpond/millpond/outbox/postgres"

	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millpond/millpond/outbox"
)

func init() {
	register(systemInfo{
		name:  "millpond",
		label: "millpond",
		notes: "outbox.Store.Enqueue in the producer's pgx.Tx; one outbox.Subscriber (batch 1000, MaxInFlight = -workers, lease 30 s) read by -workers goroutines that Ack each message; acks are written in batches; NOTIFY at most every 10 ms per stream plus quick polls after a wake-up",
		order: 0,
		new:   func(o Options) System { return &millpondSystem{workers: o.Workers} },
	})
	register(systemInfo{
		name:    "millpond-1m",
		label:   "millpond, 1,000,000 delivered rows in the table",
		notes:   "as millpond, on a table that already holds 1,000,000 delivered rows (vacuumed and analyzed), whatever -prefill says",
		order:   1,
		prefill: 1_000_000,
		new:     func(o Options) System { return &millpondSystem{workers: o.Workers} },
	})
}

const millpondStream = "bench"

// millpondSystem runs the library under test: Store for enqueue, the
// Watermill Subscriber for delivery.
type millpondSystem struct {
	workers int
	pool    *pgxpool.Pool
	store   *outbox.Store
	sub     *outbox.Subscriber
	wg      sync.WaitGroup
}

func (s *millpondSystem) Setup(ctx context.Context, pool *pgxpool.Pool) error {
	s.pool = pool
	store, err := postgres.New(pool)
	if err != nil {
		return err
	}
	s.store = store
	// Start from the current schema, whatever an earlier run left.
	if err := store.MigrateDown(ctx); err != nil {
		return err
	}
	return store.Migrate(ctx)
}

func (s *millpondSystem) Reset(ctx context.Context) error {
	_, err := s.pool.Exec(ctx, `TRUNCATE millpond_outbox, millpond_subscriptions`)
	return err
}

// Prefill writes delivered rows straight into the table, as months of
// history would leave them.
func (s *millpondSystem) Prefill(ctx context.Context, n int) error {
	_, err := s.pool.Exec(ctx, `
		INSERT INTO millpond_outbox (stream, consumer_group, event_key, event_kind, payload, metadata, content_hash,
			status, attempts, claim_key, available_at, created_at, delivered_at, settled)
		SELECT $2, '', 'prefill-' || g, 'bench', convert_to(repeat('x', 200), 'UTF8'), '{}', sha256('prefill'::bytea),
			'delivered', 1, md5(g::text), 0, 0, 0, true
		FROM generate_series(1, $1) AS g`, n, millpondStream)
	if err != nil {
		return fmt.Errorf("prefill: %w", err)
	}
	_, err = s.pool.Exec(ctx, `VACUUM (ANALYZE) millpond_outbox`)
	return err
}

func (s *millpondSystem) Enqueue(ctx context.Context, tx pgx.Tx, payload []byte) error {
	_, err := s.store.Enqueue(ctx, outbox.PgxTx(tx), outbox.Event{
		Stream: millpondStream, Key: uuid.NewString(), Kind: "bench_event", Payload: payload,
	})
	return err
}

func (s *millpondSystem) Start(ctx context.Context, handler Handler) error {
	sub, err := outbox.NewSubscriber(s.store, outbox.SubscriberConfig{
		BatchSize:   1000,
		MaxInFlight: s.workers,
		Lease:       30 * time.Second,
	})
	if err != nil {
		return err
	}
	msgs, err := sub.Subscribe(ctx, millpondStream)
	if err != nil {
		return err
	}
	s.sub = sub
	for range s.workers {
		s.wg.Go(func() {
			for msg := range msgs {
				handler(msg.Payload)
				msg.Ack()
			}
		})
	}
	return nil
}

func (s *millpondSystem) Stop(ctx context.Context) error {
	err := s.sub.Close()
	s.wg.Wait()
	return err
}
