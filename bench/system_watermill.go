package main

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func init() {
	register(systemInfo{
		name:  "watermill-sql",
		label: "watermill-sql (queue schema, N subscribers)",
		notes: "Publisher over the producer's pgx.Tx (TxFromPgx); PostgreSQLQueueSchema + PostgreSQLQueueOffsetsAdapter (mark acked, no delete), batch 100, PollInterval 50ms; one Subscriber per worker on the same topic (the queue schema has no consumer groups, so they compete for the same rows)",
		order: 30,
		new: func(o Options) System {
			return &watermillSystem{subscribers: o.Workers}
		},
	})
	register(systemInfo{
		name:  "watermill-sql-1sub",
		label: "watermill-sql (queue schema, 1 subscriber)",
		notes: "as watermill-sql, but a single Subscriber; its messages are handed to the handler one at a time",
		order: 31,
		new:   func(Options) System { return &watermillSystem{subscribers: 1} },
	})
}

// watermillTopic is the topic name; its table is "watermill_<topic>".
const watermillTopic = "bench"

// watermillPollInterval is the subscriber's idle poll, set to match the raw
// system's (watermill's default is 1s).
const watermillPollInterval = 50 * time.Millisecond

// watermillSystem runs watermill-sql's PostgreSQL queue schema over pgx.
type watermillSystem struct {
	subscribers int

	pool    *pgxpool.Pool
	schema  wsql.PostgreSQLQueueSchema
	offsets wsql.PostgreSQLQueueOffsetsAdapter
	logger  watermill.LoggerAdapter

	subs   []*wsql.Subscriber
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func (s *watermillSystem) Setup(ctx context.Context, pool *pgxpool.Pool) error {
	s.pool = pool
	s.logger = watermill.NewSlogLogger(quietLogger())
	if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS "watermill_`+watermillTopic+`"`); err != nil {
		return err
	}
	sub, err := s.newSubscriber()
	if err != nil {
		return err
	}
	defer sub.Close()
	return sub.SubscribeInitialize(watermillTopic)
}

func (s *watermillSystem) newSubscriber() (*wsql.Subscriber, error) {
	return wsql.NewSubscriber(wsql.BeginnerFromPgx(s.pool), wsql.SubscriberConfig{
		SchemaAdapter:  s.schema,
		OffsetsAdapter: s.offsets,
		PollInterval:   watermillPollInterval,
	}, s.logger)
}

func (s *watermillSystem) Reset(ctx context.Context) error {
	_, err := s.pool.Exec(ctx, `TRUNCATE "watermill_`+watermillTopic+`" RESTART IDENTITY`)
	return err
}

func (s *watermillSystem) Prefill(ctx context.Context, n int) error {
	_, err := s.pool.Exec(ctx, `
		INSERT INTO "watermill_`+watermillTopic+`" (uuid, payload, metadata, acked)
		SELECT gen_random_uuid()::text, json_build_object('id', -g, 'pad', repeat('x', 180)), '{}', true
		FROM generate_series(1, $1) AS g`, n)
	if err != nil {
		return err
	}
	_, err = s.pool.Exec(ctx, `VACUUM (ANALYZE) "watermill_`+watermillTopic+`"`)
	return err
}

func (s *watermillSystem) Enqueue(ctx context.Context, tx pgx.Tx, payload []byte) error {
	pub, err := wsql.NewPublisher(wsql.TxFromPgx(tx), wsql.PublisherConfig{SchemaAdapter: s.schema}, s.logger)
	if err != nil {
		return err
	}
	msg := message.NewMessageWithContext(ctx, watermill.NewUUID(), payload)
	return pub.Publish(watermillTopic, msg)
}

func (s *watermillSystem) Start(ctx context.Context, handler Handler) error {
	ctx, s.cancel = context.WithCancel(ctx)
	for range s.subscribers {
		sub, err := s.newSubscriber()
		if err != nil {
			return err
		}
		msgs, err := sub.Subscribe(ctx, watermillTopic)
		if err != nil {
			return err
		}
		s.subs = append(s.subs, sub)
		s.wg.Go(func() {
			for msg := range msgs {
				handler(msg.Payload)
				msg.Ack()
			}
		})
	}
	return nil
}

func (s *watermillSystem) Stop(ctx context.Context) error {
	if s.cancel == nil {
		return errors.New("watermill-sql: not started")
	}
	// Close first so in-flight queries finish on a live context, then
	// cancel whatever is left.
	var errs []error
	for _, sub := range s.subs {
		errs = append(errs, sub.Close())
	}
	s.cancel()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		errs = append(errs, ctx.Err())
	}
	return errors.Join(errs...)
}
