package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/google/uuid"

	"github.com/millpond/millpond/bus"
	"github.com/millpond/millpond/handlers"
	"github.com/millpond/millpond/outbox"
)

var allDialects = []string{dialectPostgres, dialectMySQL, dialectSQLite}

func init() {
	register(systemInfo{
		name:     "millpond",
		label:    "millpond, bare Subscriber (batch 1000, 8 in flight)",
		notes:    "outbox.Store.Enqueue in the producer's transaction; one outbox.Subscriber of the default group (BatchSize 1000, MaxInFlight = -workers, lease 30 s) read by -workers goroutines that Ack each message; acks are written in batches; on PostgreSQL a NOTIFY per committed enqueue on a quiet stream (at most every 3 ms), every 10 ms on a busy one, plus quick polls after a wake-up, elsewhere a 50 ms poll and in-process wake-ups",
		order:    0,
		dialects: allDialects,
		new: func(o Options) System {
			return &millpondSystem{workers: o.Workers, batch: 1000, inFlight: o.Workers}
		},
	})
	register(systemInfo{
		name:     "millpond-delete",
		label:    "millpond, bare Subscriber (batch 1000, 8 in flight), WithDeleteOnAck",
		notes:    "as millpond, on a store with outbox.WithDeleteOnAck: an acknowledgement deletes the group's delivery row instead of marking it delivered (the event stays until Purge)",
		order:    0,
		dialects: allDialects,
		extra:    true,
		new: func(o Options) System {
			return &millpondSystem{workers: o.Workers, batch: 1000, inFlight: o.Workers, deleteOnAck: true}
		},
	})
	register(systemInfo{
		name:     "millpond-held",
		label:    "millpond, bare Subscriber (batch 1000, 8 in flight), HoldClaims",
		notes:    "as millpond, with SubscriberConfig.HoldClaims: each batch is held in a transaction of the subscription's own (Store.ClaimHeld, at most 3 at once) instead of leased, and settled in it by one statement once its last message is acked, so a delivered row is written once instead of at the claim and at the acknowledgement; held from the first claim (HoldClaimsAfter -1, the steady state)",
		order:    0,
		dialects: []string{dialectPostgres, dialectMySQL},
		extra:    true,
		new: func(o Options) System {
			return &millpondSystem{workers: o.Workers, batch: 1000, inFlight: o.Workers, hold: true}
		},
	})
	register(systemInfo{
		name:     "millpond-held-delete",
		label:    "millpond, bare Subscriber (batch 1000, 8 in flight), HoldClaims, WithDeleteOnAck",
		notes:    "as millpond-held, on a store with outbox.WithDeleteOnAck (see millpond-delete)",
		order:    0,
		dialects: []string{dialectPostgres, dialectMySQL},
		extra:    true,
		new: func(o Options) System {
			return &millpondSystem{workers: o.Workers, batch: 1000, inFlight: o.Workers, hold: true, deleteOnAck: true}
		},
	})
	register(systemInfo{
		name:     "millpond-held-ordered-1000",
		label:    "millpond, bare Subscriber, ordering keys over 1000 keys (batch 1000, 8 in flight), HoldClaims",
		notes:    "as millpond-ordered-1000, with SubscriberConfig.HoldClaims: each held batch's settle acknowledges its ordered events and promotes the next event of each key, which the subscription then claims",
		order:    5,
		dialects: []string{dialectPostgres, dialectMySQL},
		extra:    true,
		new: func(o Options) System {
			return &millpondSystem{workers: o.Workers, batch: 1000, inFlight: o.Workers, orderKeys: 1000, hold: true}
		},
	})
	register(systemInfo{
		name:     "millpond-bus-held",
		label:    "millpond, bus + typed handler (batch 1000, 8 in flight), HoldClaims",
		notes:    "as millpond-bus, with bus.Config.Subscriber.HoldClaims (see millpond-held)",
		order:    2,
		dialects: []string{dialectPostgres, dialectMySQL},
		extra:    true,
		new: func(o Options) System {
			return &millpondSystem{workers: o.Workers, batch: 1000, inFlight: o.Workers, bus: true, hold: true}
		},
	})
	register(systemInfo{
		name:     "millpond-default",
		label:    "millpond, bare Subscriber (defaults: batch 100, 1 in flight)",
		notes:    "as millpond, with SubscriberConfig left at its defaults (BatchSize 100, MaxInFlight 1); -workers goroutines read the channel, but only one message is out at a time",
		order:    1,
		dialects: allDialects,
		new:      func(o Options) System { return &millpondSystem{workers: o.Workers} },
	})
	register(systemInfo{
		name:     "millpond-bus",
		label:    "millpond, bus + typed handler (batch 1000, 8 in flight)",
		notes:    "what applications run: bus.New with one handlers.New[T] typed handler (JSON decoded into a struct) in its own consumer group, registered before the enqueue phase; bus.Config.Subscriber BatchSize 1000, handlers.WithMaxInFlight(-workers); the bus's default unrouted policy (a subscriber of the default group) runs too",
		order:    2,
		dialects: allDialects,
		new: func(o Options) System {
			return &millpondSystem{workers: o.Workers, batch: 1000, inFlight: o.Workers, bus: true}
		},
	})
	register(systemInfo{
		name:     "millpond-bus-default",
		label:    "millpond, bus + typed handler (defaults)",
		notes:    "as millpond-bus with bus.Config{} and no handler options: BatchSize 100, MaxInFlight 1",
		order:    3,
		dialects: allDialects,
		new:      func(o Options) System { return &millpondSystem{workers: o.Workers, bus: true} },
	})
	for i, keys := range []int{1000, 10} {
		register(systemInfo{
			name:  fmt.Sprintf("millpond-ordered-%d", keys),
			label: fmt.Sprintf("millpond, bare Subscriber, ordering keys over %d keys (batch 1000, 8 in flight)", keys),
			notes: fmt.Sprintf("as millpond, every event with an ordering key, the n-th event's key being n mod %d: "+
				"each key's events are handed out one at a time, in commit order; the Subscriber writes their acks in batches of at most 128, "+
				"two statements at a time, each claiming the next events of its keys for the Subscriber (Store.AcknowledgeAndClaimNext)", keys),
			order:    5 + i,
			dialects: allDialects,
			extra:    true,
			new: func(o Options) System {
				return &millpondSystem{workers: o.Workers, batch: 1000, inFlight: o.Workers, orderKeys: keys}
			},
		})
	}
	register(systemInfo{
		name:    "millpond-1m",
		label:   "millpond, bare Subscriber, 1,000,000 delivered rows in the table",
		notes:   "as millpond, on a table that already holds 1,000,000 delivered rows (vacuumed and analyzed), whatever -prefill says",
		order:   4,
		prefill: 1_000_000,
		extra:   true,
		new: func(o Options) System {
			return &millpondSystem{workers: o.Workers, batch: 1000, inFlight: o.Workers}
		},
	})
}

const (
	millpondStream  = "bench"
	millpondKind    = "bench_event"
	millpondHandler = "bench-handler"
)

// benchEvent is the typed event the bus's handler decodes.
type benchEvent struct {
	ID  int64  `json:"id"`
	Pad string `json:"pad"`
}

// millpondSystem runs the library under test: Store for enqueue, and either
// a bare Watermill Subscriber or the bus with one typed handler for
// delivery. Zero batch and inFlight take the library's defaults.
type millpondSystem struct {
	workers  int
	batch    int
	inFlight int
	bus      bool
	// orderKeys > 0 gives the events ordering keys, round robin over
	// this many keys.
	orderKeys int
	// deleteOnAck opens the store with outbox.WithDeleteOnAck.
	deleteOnAck bool
	// hold sets SubscriberConfig.HoldClaims.
	hold     bool
	enqueued atomic.Int64

	db    *database
	store *outbox.Store
	sub   *outbox.Subscriber
	b     *bus.Bus
	wg    sync.WaitGroup
}

func (s *millpondSystem) Setup(ctx context.Context, db *database) error {
	s.db = db
	var opts []outbox.Option
	if s.deleteOnAck {
		opts = append(opts, outbox.WithDeleteOnAck())
	}
	store, err := db.store(opts...)
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
	if err := s.db.truncate(ctx, "millpond_outbox", "millpond_subscriptions", "millpond_ordering"); err != nil {
		return err
	}
	if !s.bus {
		return nil
	}
	// The handler's group must be registered before events are enqueued,
	// as an application's bus is before it serves (fx start order).
	b, err := s.newBus(nil)
	if err != nil {
		return err
	}
	return b.RegisterGroups(ctx)
}

// Prefill writes delivered rows straight into the table, as months of
// history would leave them (PostgreSQL and MySQL).
func (s *millpondSystem) Prefill(ctx context.Context, n int) error {
	if s.db.dialect == dialectMySQL {
		err := s.db.exec(ctx,
			`INSERT INTO millpond_events (stream, event_key, event_kind, payload, metadata, content_hash, created_at)
SELECT ?, CONCAT('prefill-', g.n), 'bench', REPEAT('x', 200), '{}', UNHEX(SHA2('prefill', 256)), 0
FROM `+mysqlNumbers+` g WHERE g.n < ? ORDER BY g.n`, millpondStream, n)
		if err == nil {
			err = s.db.exec(ctx,
				`INSERT INTO millpond_deliveries (event_id, stream, consumer_group, status, attempts, claim_key, available_at, delivered_at)
SELECT id, stream, '', 'delivered', 1, MD5(id), 0, 1 FROM millpond_events WHERE event_key LIKE 'prefill-%' ORDER BY id`)
		}
		if err == nil {
			err = s.db.execAll(ctx, "ANALYZE TABLE millpond_events", "ANALYZE TABLE millpond_deliveries")
		}
		if err != nil {
			return fmt.Errorf("prefill: %w", err)
		}
		return nil
	}
	if s.db.dialect != dialectPostgres {
		return errors.New("prefill is implemented for PostgreSQL and MySQL only")
	}
	err := s.db.exec(ctx, `
		WITH ev AS (
			INSERT INTO millpond_events (stream, event_key, event_kind, payload, metadata, content_hash, created_at)
			SELECT $2, 'prefill-' || g, 'bench', convert_to(repeat('x', 200), 'UTF8'), '{}', sha256('prefill'::bytea), 0
			FROM generate_series(1, $1) AS g
			RETURNING id
		)
		INSERT INTO millpond_deliveries (event_id, stream, consumer_group, status, attempts, claim_key, available_at, delivered_at, settled)
		SELECT id, $2, '', 'delivered', 1, md5(id::text), 0, 1, true FROM ev ORDER BY id`, n, millpondStream)
	if err != nil {
		return fmt.Errorf("prefill: %w", err)
	}
	return s.db.exec(ctx, `VACUUM (ANALYZE) millpond_events, millpond_deliveries`)
}

func (s *millpondSystem) Enqueue(ctx context.Context, tx *benchTx, payload []byte) error {
	ev := outbox.Event{Stream: millpondStream, Key: uuid.NewString(), Kind: millpondKind, Payload: payload}
	if s.orderKeys > 0 {
		ev.OrderingKey = fmt.Sprintf("k%05d", (s.enqueued.Add(1)-1)%int64(s.orderKeys))
	}
	_, err := s.store.Enqueue(ctx, tx.outbox(), ev)
	return err
}

// newBus builds the bus as an application would: one typed handler.
func (s *millpondSystem) newBus(h Handler) (*bus.Bus, error) {
	var cfg bus.Config
	var opts []handlers.Option
	if s.batch > 0 {
		cfg.Subscriber.BatchSize = s.batch
	}
	cfg.Subscriber.HoldClaims = s.hold
	cfg.Subscriber.HoldClaimsAfter = -1 // steady state: held from the first claim
	if s.inFlight > 0 {
		opts = append(opts, handlers.WithMaxInFlight(s.inFlight))
	}
	fn := func(ctx context.Context, ev benchEvent, _ handlers.Meta) error {
		if h != nil {
			h.handleID(ev.ID)
		}
		return nil
	}
	return bus.New(s.store, cfg, handlers.New(millpondHandler, millpondStream, millpondKind, fn, opts...))
}

func (s *millpondSystem) Start(ctx context.Context, handler Handler) error {
	if s.bus {
		b, err := s.newBus(handler)
		if err != nil {
			return err
		}
		s.b = b
		return b.Start(ctx)
	}
	sub, err := outbox.NewSubscriber(s.store, outbox.SubscriberConfig{
		BatchSize:   s.batch,
		MaxInFlight: s.inFlight,
		HoldClaims:  s.hold,
		// Steady state: held from the first claim (a fresh subscription
		// leases its claims for twice its lease by default).
		HoldClaimsAfter: -1,
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
				handler.handle(msg.Payload)
				msg.Ack()
			}
		})
	}
	return nil
}

func (s *millpondSystem) Stop(ctx context.Context) error {
	if s.b != nil {
		return s.b.Stop(ctx)
	}
	if s.sub == nil {
		return errors.New("millpond: not started")
	}
	err := s.sub.Close()
	s.wg.Wait()
	return err
}
