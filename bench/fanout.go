package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"

	"github.com/millpond/millpond/outbox"
)

// The fan-out measurement: one stream read by several consumer groups.
// For 1, 4 and 8 groups it measures what an event costs to enqueue (against
// the raw INSERT, interleaved as in the enqueue phase) and how many bytes it
// takes on disk (the tables with their indexes, divided by the events); then
// the delivery rate with four groups and 4 KiB payloads.

// fanoutGroups are the group counts measured.
var fanoutGroups = []int{1, 4, 8}

// fanoutDeliveryGroups and fanoutPayload shape the fan-out delivery run.
const (
	fanoutDeliveryGroups = 4
	fanoutPayload        = 4096
)

// fanoutSystem is a system with consumer groups.
type fanoutSystem interface {
	label() string
	// setup leaves the system's tables empty with groups consumer groups
	// that will each get every event enqueued from now on.
	setup(ctx context.Context, db *database, groups int) error
	enqueue(ctx context.Context, tx *benchTx, payload []byte) error
	// tables holds the system's events (for their size).
	tables() []string
	// start starts one consumer per group, group i calling hs[i].
	start(ctx context.Context, hs []*tracker) error
	stop(ctx context.Context) error
}

// fanoutSystems returns the fan-out systems for the dialect.
func fanoutSystems(dialect string, workers int) []fanoutSystem {
	out := []fanoutSystem{&millpondFanout{workers: workers}}
	if dialect == dialectPostgres {
		out = append(out, &millpondFanout{workers: workers, hold: true})
	}
	if dialect != dialectSQLite {
		out = append(out, &watermillFanout{})
	}
	return out
}

// fanoutEnqueue is one system's enqueue figures with a number of groups.
type fanoutEnqueue struct {
	system        string
	groups        int
	cost          float64
	ratios        []float64
	bytesPerEvent float64
	err           error
}

// fanoutDelivery is one delivery run with several groups.
type fanoutDelivery struct {
	system string
	rate   float64 // deliveries (event × group) per second
	err    error
}

// runFanout measures every fan-out system; n is the events per measurement.
func runFanout(ctx context.Context, db *database, cfg config) ([]fanoutEnqueue, []fanoutDelivery) {
	var enq []fanoutEnqueue
	var del []fanoutDelivery
	systems := fanoutSystems(db.dialect, cfg.workers)
	n := cfg.fanoutEvents
	for _, groups := range fanoutGroups {
		for _, sys := range systems {
			if m, ok := sys.(*millpondFanout); ok && m.hold {
				continue // enqueues as millpond does: measured for delivery only
			}
			r := fanoutEnqueue{system: sys.label(), groups: groups}
			r.cost, r.ratios, r.bytesPerEvent, r.err = measureFanoutEnqueue(ctx, db, cfg, sys, groups, n)
			if r.err != nil {
				logf("fan-out %s, %d groups: %v", sys.label(), groups, r.err)
			} else {
				logf("fan-out %s, %d groups: enqueue %.2fx raw INSERT, %.0f bytes/event", sys.label(), groups, r.cost, r.bytesPerEvent)
			}
			enq = append(enq, r)
			if ctx.Err() != nil {
				return enq, del
			}
		}
	}
	for range cfg.fanoutRuns {
		for _, sys := range systems {
			d := fanoutDelivery{system: sys.label()}
			d.rate, d.err = measureFanoutDelivery(ctx, db, cfg, sys, n)
			if d.err != nil {
				logf("fan-out delivery %s: %v", sys.label(), d.err)
			} else {
				logf("fan-out delivery %s: %.0f deliveries/s", sys.label(), d.rate)
			}
			del = append(del, d)
			if ctx.Err() != nil {
				return enq, del
			}
		}
	}
	return enq, del
}

func measureFanoutEnqueue(ctx context.Context, db *database, cfg config, sys fanoutSystem, groups, n int) (float64, []float64, float64, error) {
	if err := sys.setup(ctx, db, groups); err != nil {
		return 0, nil, 0, fmt.Errorf("setup: %w", err)
	}
	if err := db.truncate(ctx, "bench_orders"); err != nil {
		return 0, nil, 0, err
	}
	var ratios []float64
	for first := 1; first <= n; {
		size := min(n/enqueueRounds+1, n-first+1)
		base, err := measureBaseline(ctx, db, cfg.producers, size)
		if err != nil {
			return 0, nil, 0, err
		}
		if err := db.checkpoint(ctx); err != nil {
			return 0, nil, 0, err
		}
		elapsed, err := runProducers(ctx, db, cfg.producers, sys.enqueue, int64(first), size, nil, nil)
		if err != nil {
			return 0, nil, 0, err
		}
		ratios = append(ratios, base/(float64(size)/elapsed.Seconds()))
		first += size
	}
	bytes, err := db.tableBytes(ctx, sys.tables()...)
	if err != nil {
		return 0, nil, 0, err
	}
	if db.dialect == dialectPostgres {
		if err := logRelationBytes(ctx, db, fmt.Sprintf("fan-out %s, %d groups", sys.label(), groups), n, sys.tables()...); err != nil {
			return 0, nil, 0, err
		}
	}
	cost := median(ratios) // sorts ratios
	return cost, ratios, float64(bytes) / float64(n), nil
}

func measureFanoutDelivery(ctx context.Context, db *database, cfg config, sys fanoutSystem, n int) (float64, error) {
	groups := fanoutDeliveryGroups
	if err := sys.setup(ctx, db, groups); err != nil {
		return 0, fmt.Errorf("setup: %w", err)
	}
	if _, err := runProducersSize(ctx, db, cfg.producers, sys.enqueue, 1, n, nil, nil, fanoutPayload); err != nil {
		return 0, err
	}
	if err := db.checkpoint(ctx); err != nil {
		return 0, err
	}
	ts := make([]*tracker, groups)
	for i := range ts {
		ts[i] = newTracker(n)
		ts[i].epoch = ts[0].epoch
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := ts[0].now()
	if err := sys.start(runCtx, ts); err != nil {
		return 0, err
	}
	var last time.Duration
	var err error
	for i, t := range ts {
		if !t.waitDistinct(ctx, int64(n), cfg.phaseTimeout) {
			err = fmt.Errorf("group %d: only %d of %d events handled within %s", i+1, t.distinct.Load(), n, cfg.phaseTimeout)
			break
		}
		last = max(last, t.lastFirstSeen(1, n))
	}
	stopCtx, stopCancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer stopCancel()
	err = errors.Join(err, sys.stop(stopCtx))
	if err != nil {
		return 0, err
	}
	return float64(groups*n) / (last - time.Duration(start)).Seconds(), nil
}

// millpondFanout: an event row in millpond_events and a delivery row per
// event and group in millpond_deliveries; each group read by a bare
// Subscriber (batch 1000, -workers in flight), holding its claims when hold
// is set (SubscriberConfig.HoldClaims).
type millpondFanout struct {
	workers  int
	hold     bool
	store    *outbox.Store
	db       *database
	migrated bool
	subs     []*outbox.Subscriber
	wg       sync.WaitGroup
}

func (m *millpondFanout) label() string {
	if m.hold {
		return "millpond, HoldClaims"
	}
	return "millpond"
}

func (m *millpondFanout) setup(ctx context.Context, db *database, groups int) error {
	m.db = db
	if !m.migrated {
		store, err := db.store()
		if err != nil {
			return err
		}
		if err := store.MigrateDown(ctx); err != nil {
			return err
		}
		if err := store.Migrate(ctx); err != nil {
			return err
		}
		m.store, m.migrated = store, true
	}
	if err := db.truncate(ctx, "millpond_outbox", "millpond_subscriptions"); err != nil {
		return err
	}
	for g := range groups {
		if err := m.store.RegisterGroup(ctx, millpondStream, "group-"+strconv.Itoa(g+1)); err != nil {
			return err
		}
	}
	return nil
}

func (m *millpondFanout) enqueue(ctx context.Context, tx *benchTx, payload []byte) error {
	_, err := m.store.Enqueue(ctx, tx.outbox(), outbox.Event{
		Stream: millpondStream, Key: uuid.NewString(), Kind: millpondKind, Payload: payload,
	})
	return err
}

func (m *millpondFanout) tables() []string { return []string{"millpond_events", "millpond_deliveries"} }

func (m *millpondFanout) start(ctx context.Context, hs []*tracker) error {
	m.subs = nil
	for g, h := range hs {
		sub, err := outbox.NewSubscriber(m.store, outbox.SubscriberConfig{
			ConsumerGroup: "group-" + strconv.Itoa(g+1), BatchSize: 1000, MaxInFlight: m.workers, HoldClaims: m.hold, HoldClaimsAfter: -1,
		})
		if err != nil {
			return err
		}
		msgs, err := sub.Subscribe(ctx, millpondStream)
		if err != nil {
			return err
		}
		m.subs = append(m.subs, sub)
		for range m.workers {
			m.wg.Go(func() {
				for msg := range msgs {
					h.handle(msg.Payload)
					msg.Ack()
				}
			})
		}
	}
	return nil
}

func (m *millpondFanout) stop(ctx context.Context) error {
	var errs []error
	for _, s := range m.subs {
		errs = append(errs, s.Close())
	}
	m.wg.Wait()
	return errors.Join(errs...)
}

// watermillFanout: watermill-sql's default schema, one row per event and an
// offset per consumer group; each group read by one Subscriber, batch 1000.
type watermillFanout struct {
	db      *database
	schema  wsql.SchemaAdapter
	offsets wsql.OffsetsAdapter
	logger  watermill.LoggerAdapter
	subs    []*wsql.Subscriber
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

const watermillFanoutTopic = "fanout"

func (w *watermillFanout) label() string {
	return "watermill-sql (default schema, an offset per group, batch 1000)"
}

func (w *watermillFanout) setup(ctx context.Context, db *database, groups int) error {
	w.db = db
	w.logger = watermill.NewSlogLogger(quietLogger())
	q := func(s string) string { return `"` + s + `"` }
	if db.dialect == dialectMySQL {
		w.schema = wsql.DefaultMySQLSchema{SubscribeBatchSize: 1000}
		w.offsets = wsql.DefaultMySQLOffsetsAdapter{}
		q = func(s string) string { return "`" + s + "`" }
	} else {
		w.schema = wsql.DefaultPostgreSQLSchema{SubscribeBatchSize: 1000}
		w.offsets = wsql.DefaultPostgreSQLOffsetsAdapter{}
	}
	for _, t := range w.tables() {
		if err := db.exec(ctx, `DROP TABLE IF EXISTS `+q(t)); err != nil {
			return err
		}
	}
	// The groups need no registration: a group is an offset row, written
	// at its first acknowledgement.
	sub, err := w.newSubscriber("group-1")
	if err != nil {
		return err
	}
	defer sub.Close()
	return sub.SubscribeInitialize(watermillFanoutTopic)
}

func (w *watermillFanout) newSubscriber(group string) (*wsql.Subscriber, error) {
	return wsql.NewSubscriber(watermillBeginner(w.db), wsql.SubscriberConfig{
		ConsumerGroup:  group,
		SchemaAdapter:  w.schema,
		OffsetsAdapter: w.offsets,
		PollInterval:   watermillPollInterval,
	}, w.logger)
}

func (w *watermillFanout) enqueue(ctx context.Context, tx *benchTx, payload []byte) error {
	pub, err := wsql.NewPublisher(watermillTx(tx), wsql.PublisherConfig{SchemaAdapter: w.schema}, w.logger)
	if err != nil {
		return err
	}
	return pub.Publish(watermillFanoutTopic, message.NewMessageWithContext(ctx, watermill.NewUUID(), payload))
}

func (w *watermillFanout) tables() []string {
	return []string{"watermill_" + watermillFanoutTopic, "watermill_offsets_" + watermillFanoutTopic}
}

func (w *watermillFanout) start(ctx context.Context, hs []*tracker) error {
	ctx, w.cancel = context.WithCancel(ctx)
	w.subs = nil
	for g, h := range hs {
		sub, err := w.newSubscriber("group-" + strconv.Itoa(g+1))
		if err != nil {
			return err
		}
		msgs, err := sub.Subscribe(ctx, watermillFanoutTopic)
		if err != nil {
			return err
		}
		w.subs = append(w.subs, sub)
		w.wg.Go(func() {
			for msg := range msgs {
				h.handle(msg.Payload)
				msg.Ack()
			}
		})
	}
	return nil
}

func (w *watermillFanout) stop(ctx context.Context) error {
	var errs []error
	for _, s := range w.subs {
		errs = append(errs, s.Close())
	}
	w.cancel()
	done := make(chan struct{})
	go func() { w.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		errs = append(errs, ctx.Err())
	}
	return errors.Join(errs...)
}

// logRelationBytes logs where a system's bytes go on PostgreSQL: each
// table, index and TOAST relation of the tables (pg_relation_size) per
// event.
func logRelationBytes(ctx context.Context, db *database, what string, events int, tables ...string) error {
	rows, err := db.pool.Query(ctx, `SELECT r.relname, pg_relation_size(r.oid) FROM pg_class t
		JOIN pg_class r ON r.oid = t.oid OR r.oid = t.reltoastrelid
			OR r.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = t.oid)
		WHERE t.oid = ANY($1::regclass[])
		ORDER BY r.relname`, tables)
	if err != nil {
		return fmt.Errorf("relation sizes: %w", err)
	}
	defer rows.Close()
	var parts []string
	for rows.Next() {
		var name string
		var size int64
		if err := rows.Scan(&name, &size); err != nil {
			return err
		}
		parts = append(parts, fmt.Sprintf("%s %.0f", name, float64(size)/float64(events)))
	}
	if err := rows.Err(); err != nil {
		return err
	}
	logf("%s: bytes per event by relation: %s", what, strings.Join(parts, ", "))
	return nil
}
