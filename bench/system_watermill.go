package main

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
)

func init() {
	const notes = "Publisher over the producer's transaction (TxFromPgx / TxFromStdSQL); the queue schema (PostgreSQLQueueSchema or MySQLQueueSchema) with its queue offsets adapter (mark acked, no delete), PollInterval 50 ms; the queue schema has no consumer groups, so the subscribers compete for the same rows"
	register(systemInfo{
		name:     "watermill-sql",
		label:    "watermill-sql, queue schema, 8 subscribers, batch 100 (its default)",
		notes:    "one Subscriber per worker, SubscribeBatchSize left at its default (100); " + notes,
		order:    30,
		dialects: []string{dialectPostgres, dialectMySQL},
		new:      func(o Options) System { return &watermillSystem{subscribers: o.Workers} },
	})
	register(systemInfo{
		name:     "watermill-sql-1000",
		label:    "watermill-sql, queue schema, 8 subscribers, batch 1000",
		notes:    "one Subscriber per worker, SubscribeBatchSize 1000; " + notes,
		order:    31,
		dialects: []string{dialectPostgres, dialectMySQL},
		new:      func(o Options) System { return &watermillSystem{subscribers: o.Workers, batch: 1000} },
	})
	register(systemInfo{
		name:  "watermill-sql-1000-delete",
		label: "watermill-sql, queue schema, 8 subscribers, batch 1000, DeleteOnAck",
		notes: "one Subscriber per worker, SubscribeBatchSize 1000; its queue offsets adapter with DeleteOnAck (an acknowledged row is deleted, as millpond's WithDeleteOnAck does); " +
			"Publisher over the producer's transaction (TxFromPgx / TxFromStdSQL); the queue schema, PollInterval 50 ms; no consumer groups",
		order:    31,
		dialects: []string{dialectPostgres, dialectMySQL},
		new: func(o Options) System {
			return &watermillSystem{subscribers: o.Workers, batch: 1000, deleteOnAck: true}
		},
	})
	register(systemInfo{
		name:     "watermill-sql-1sub",
		label:    "watermill-sql, queue schema, 1 subscriber, batch 100",
		notes:    "a single Subscriber, its messages handed to the handler one at a time; " + notes,
		order:    32,
		dialects: []string{dialectPostgres, dialectMySQL},
		extra:    true,
		new:      func(Options) System { return &watermillSystem{subscribers: 1} },
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
	batch       int // 0: the schema's default
	deleteOnAck bool

	db      *database
	schema  wsql.SchemaAdapter
	offsets wsql.OffsetsAdapter
	logger  watermill.LoggerAdapter

	subs   []*wsql.Subscriber
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func (s *watermillSystem) Setup(ctx context.Context, db *database) error {
	s.db = db
	s.logger = watermill.NewSlogLogger(quietLogger())
	table := "watermill_" + watermillTopic
	if db.dialect == dialectMySQL {
		s.schema = wsql.MySQLQueueSchema{SubscribeBatchSize: s.batch}
		s.offsets = wsql.MySQLQueueOffsetsAdapter{DeleteOnAck: s.deleteOnAck}
		table = "`" + table + "`"
	} else {
		s.schema = wsql.PostgreSQLQueueSchema{SubscribeBatchSize: s.batch}
		s.offsets = wsql.PostgreSQLQueueOffsetsAdapter{DeleteOnAck: s.deleteOnAck}
		table = `"` + table + `"`
	}
	if err := db.exec(ctx, `DROP TABLE IF EXISTS `+table); err != nil {
		return err
	}
	sub, err := s.newSubscriber()
	if err != nil {
		return err
	}
	defer sub.Close()
	return sub.SubscribeInitialize(watermillTopic)
}

// beginner is watermill-sql's view of the run's connections.
func (s *watermillSystem) beginner() wsql.Beginner { return watermillBeginner(s.db) }

func watermillBeginner(db *database) wsql.Beginner {
	if db.pool != nil {
		return wsql.BeginnerFromPgx(db.pool)
	}
	return wsql.BeginnerFromStdSQL(db.db)
}

// watermillTx is watermill-sql's view of a producer transaction.
func watermillTx(tx *benchTx) wsql.ContextExecutor {
	if tx.pgx != nil {
		return wsql.TxFromPgx(tx.pgx)
	}
	return wsql.TxFromStdSQL(tx.sql)
}

func (s *watermillSystem) newSubscriber() (*wsql.Subscriber, error) {
	return wsql.NewSubscriber(s.beginner(), wsql.SubscriberConfig{
		SchemaAdapter:  s.schema,
		OffsetsAdapter: s.offsets,
		PollInterval:   watermillPollInterval,
	}, s.logger)
}

func (s *watermillSystem) Reset(ctx context.Context) error {
	return s.db.truncate(ctx, "watermill_"+watermillTopic)
}

func (s *watermillSystem) Prefill(ctx context.Context, n int) error {
	if s.deleteOnAck {
		// Acknowledged rows are deleted: months of history leave none.
		return nil
	}
	if s.db.dialect == dialectMySQL {
		// Acked rows, as the queue schema's offsets adapter leaves them
		// (mark acked, no delete).
		table := "`watermill_" + watermillTopic + "`"
		err := s.db.exec(ctx, `INSERT INTO `+table+` (uuid, payload, metadata, acked)
SELECT UUID(), JSON_OBJECT('id', -g.n, 'pad', REPEAT('x', 180)), '{}', TRUE
FROM `+mysqlNumbers+` g WHERE g.n < ? ORDER BY g.n`, n)
		if err == nil {
			err = s.db.exec(ctx, "ANALYZE TABLE "+table)
		}
		return err
	}
	if s.db.dialect != dialectPostgres {
		return errors.New("prefill is implemented for PostgreSQL and MySQL only")
	}
	err := s.db.exec(ctx, `
		INSERT INTO "watermill_`+watermillTopic+`" (uuid, payload, metadata, acked)
		SELECT gen_random_uuid()::text, json_build_object('id', -g, 'pad', repeat('x', 180)), '{}', true
		FROM generate_series(1, $1) AS g`, n)
	if err != nil {
		return err
	}
	return s.db.exec(ctx, `VACUUM (ANALYZE) "watermill_`+watermillTopic+`"`)
}

func (s *watermillSystem) Enqueue(ctx context.Context, tx *benchTx, payload []byte) error {
	pub, err := wsql.NewPublisher(watermillTx(tx), wsql.PublisherConfig{SchemaAdapter: s.schema}, s.logger)
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
				handler.handle(msg.Payload)
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
