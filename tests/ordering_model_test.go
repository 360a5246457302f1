package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/outbox/postgres"
)

// TestOrderingModel is a randomized model check of ordering keys. For a
// while (the chaos phase) producers enqueue events, most of them on a few
// ordering keys, some unordered, re-enqueue known events and roll
// transactions back, while consumers of two consumer groups (one with
// DeadLetterHold, one with DeadLetterSkip) claim them (Claim, hand-overs of
// AcknowledgeAndClaimNext and, on PostgreSQL and MySQL, held claims) and acknowledge,
// fail with short delays, release or abandon them to their (short)
// leases, and an operator requeues or discards dead letters. Then failures
// stop and every dead letter is requeued or discarded until each
// committed event is settled in each group. Checked as it runs and at the
// end, per (group, ordering key):
//
//   - a claim never hands out an event while another event of its key is
//     claimed under a live lease, and never an event already acknowledged
//     or discarded;
//   - the events of a key are handed out in sequence: each one first
//     claimed has the next sequence number, and only once its predecessor
//     was acknowledged or discarded (or, under skip, dead-lettered);
//     under hold a requeued head comes back before the key's later events;
//   - sequence numbers are 1..N over the key's committed events, the same
//     in both groups, in commit order (an event committed before another's
//     transaction began has the lower number; in one transaction, the
//     order of enqueue);
//   - every committed event is acknowledged exactly once or discarded as
//     a dead letter, never both; nothing rolled back is handed out; a
//     known event enqueued again inserts nothing;
//   - in the database, at any moment: at most one event of a key pending
//     or processing (or holding it dead), blocked events always behind
//     such a head, the key row counting exactly its unsettled events;
//   - in the end nothing is left pending, processing, blocked or dead and
//     every key counts no unsettled event.
//
// The drain fails when nothing settles for stuckAfter. Producers pause
// while maxBacklog events wait for a group.
//
// MILLPOND_FUZZ_SEED repeats a run's random choices (the interleaving of
// the goroutines still varies); the seed is logged. Each dialect runs the
// chaos phase for 3 s with and without WithDeleteOnAck (about 5 s per
// case); MILLPOND_FUZZ_LONG=1 runs it for a minute, MILLPOND_FUZZ_DURATION
// for any duration.
func TestOrderingModel(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("MILLPOND_FUZZ_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("MILLPOND_FUZZ_SEED=%q: %v", v, err)
		}
		seed = s
	}
	t.Logf("seed %d (MILLPOND_FUZZ_SEED=%d repeats the random choices)", seed, seed)
	chaos := 3 * time.Second
	if os.Getenv("MILLPOND_FUZZ_LONG") == "1" {
		chaos = time.Minute
	}
	if v := os.Getenv("MILLPOND_FUZZ_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("MILLPOND_FUZZ_DURATION=%q: %v", v, err)
		}
		chaos = d
	}
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			for _, deleteOnAck := range []bool{false, true} {
				name := "KeepDelivered"
				if deleteOnAck {
					name = "DeleteOnAck"
				}
				t.Run(name, func(t *testing.T) {
					h := fnv.New64a()
					h.Write([]byte(dialect + "/" + name))
					m := newOrderModel(t, dialect, deleteOnAck, seed^h.Sum64())
					m.run(chaos)
				})
			}
		})
	}
}

const (
	modelStream   = "m"
	modelAttempts = 2
	modelLease    = time.Second
	// leaseSlack allows for the difference between the client's clock and
	// the database's when deciding that a lease was still live.
	leaseSlack = 250 * time.Millisecond
	// maxBacklog is the most committed events the producers let wait for
	// a group: a few keys deliver one event per round trip each, and an
	// expired lease holds its key for a second.
	maxBacklog = 300
	// stuckAfter is how long the drain may go without settling anything
	// before the events left count as stuck: several leases and retries.
	stuckAfter = 10 * time.Second
)

// modelGroups are the two consumer groups and their dead-letter policies.
var modelGroups = []struct {
	name   string
	policy outbox.DeadLetterPolicy
}{{"hold", outbox.DeadLetterHold}, {"skip", outbox.DeadLetterSkip}}

// modelEvent is what the producers know of one event.
type modelEvent struct {
	key, okey string
	payload   []byte
	// tx and idx place the event in its transaction; start is the logical
	// time before the transaction's first enqueue, commit after its commit
	// returned (0 while not committed).
	tx, idx       int64
	start, commit int64
	rolledBack    bool
}

// modelDelivery is what the model knows of one event in one group.
type modelDelivery struct {
	seq      int64 // 0 until first claimed
	claims   int
	attempts int // of the latest claim
	acks     int
	acking   int  // acknowledgements under way
	failing  bool // a final failure (dead letter) under way or done
	dead     bool // seen dead (ListDead) or failed at the limit
	requeues int
	// discarding is set before DiscardDead is called, discarded once it
	// deleted the row.
	discarding, discarded bool
	lastID                int64
}

// flight is one claim the model takes to be outstanding.
type flight struct {
	key      string
	expires  time.Time
	settling bool // its holder is settling it (ack, fail, release, settle)
}

// keyModel is one (group, ordering key).
type keyModel struct {
	last     int64              // highest sequence number handed out in sequence
	bySeq    map[int64]string   // sequence number -> event key
	inFlight map[string]*flight // claim token -> claim
}

type orderModel struct {
	t           *testing.T
	ctx         context.Context
	dialect     string
	deleteOnAck bool
	seed        uint64
	db          *testdb.Database
	pool        *pgxpool.Pool // PostgreSQL
	s           *outbox.Store

	clock  atomic.Int64 // logical time for commit order
	txSeq  atomic.Int64
	tokSeq atomic.Int64
	calm   atomic.Bool // failures stopped
	// settledN counts (group, event) deliveries acknowledged or discarded,
	// committedN committed events: the producers keep the backlog bounded.
	settledN, committedN atomic.Int64

	mu         sync.Mutex
	events     map[string]*modelEvent
	committed  []string
	deliveries map[[2]string]*modelDelivery // (group, event key)
	keys       map[[2]string]*keyModel      // (group, ordering key)
	errs       []string

	// counters for the log
	claims, handedOver, held, acks, fails, deadLettered, releases, abandoned, requeued, discarded, reEnqueued, rolledBack, conflicts, deadlocks atomic.Int64
}

func newOrderModel(t *testing.T, dialect string, deleteOnAck bool, seed uint64) *orderModel {
	t.Logf("case seed %d", seed)
	m := &orderModel{t: t, ctx: context.Background(), dialect: dialect, deleteOnAck: deleteOnAck, seed: seed,
		events: map[string]*modelEvent{}, deliveries: map[[2]string]*modelDelivery{}, keys: map[[2]string]*keyModel{}}
	m.db = testdb.New(t, dialect)
	opts := []outbox.Option{outbox.WithoutListen()}
	if deleteOnAck {
		opts = append(opts, outbox.WithDeleteOnAck())
	}
	if dialect == "postgres" {
		// The default pool (4 connections on 2 cores) would make the
		// goroutines take turns instead of racing.
		pool, err := pgxpool.New(m.ctx, m.db.URL+"&pool_max_conns=24")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		m.pool = pool
		s, err := postgres.New(pool, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		if err := s.Migrate(m.ctx); err != nil {
			t.Fatal(err)
		}
		m.s = s
	} else {
		m.s = m.db.Store(t, opts...)
	}
	for _, g := range modelGroups {
		if err := m.s.RegisterGroup(m.ctx, modelStream, g.name); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

func (m *orderModel) errorf(format string, args ...any) {
	m.errs = append(m.errs, fmt.Sprintf(format, args...))
}

// fail records a violation from outside the model's lock.
func (m *orderModel) fail(format string, args ...any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.errorf(format, args...)
}

func (m *orderModel) failed() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.errs) > 0
}

func (m *orderModel) rng(stream uint64) *rand.Rand {
	return rand.New(rand.NewPCG(m.seed, stream))
}

func (m *orderModel) delivery(group, key string) *modelDelivery {
	d := m.deliveries[[2]string{group, key}]
	if d == nil {
		d = &modelDelivery{}
		m.deliveries[[2]string{group, key}] = d
	}
	return d
}

func (m *orderModel) keyOf(group, okey string) *keyModel {
	k := m.keys[[2]string{group, okey}]
	if k == nil {
		k = &keyModel{bySeq: map[int64]string{}, inFlight: map[string]*flight{}}
		m.keys[[2]string{group, okey}] = k
	}
	return k
}

func policyOf(group string) outbox.DeadLetterPolicy {
	for _, g := range modelGroups {
		if g.name == group {
			return g.policy
		}
	}
	panic("unknown group " + group)
}

// settledBefore reports whether d, the predecessor of a key's new head,
// was settled (or is being settled) so that its successor may go.
func settledBefore(d *modelDelivery, policy outbox.DeadLetterPolicy) bool {
	if d.acks > 0 || d.acking > 0 || d.discarding || d.discarded {
		return true
	}
	// Under skip a dead letter lets its key go: failed at the limit, or
	// its last lease expired and a claim dead-lettered it.
	return policy == outbox.DeadLetterSkip && (d.failing || d.dead || d.attempts >= modelAttempts)
}

// claimed records claims returned to a consumer: token names each claim
// (its claim key, or a held claim's own token).
func (m *orderModel) claimed(cs []outbox.Claimed, tokens []string, how string) {
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, c := range cs {
		if c.Stream != modelStream {
			m.errorf("%s: claim of stream %q", how, c.Stream)
		}
		d := m.delivery(c.Group, c.Key)
		d.claims++
		d.attempts = c.Attempts
		d.lastID = c.ID
		if d.acks > 0 || d.discarded {
			m.errorf("%s: %s/%s claimed (attempt %d) after it was %s", how, c.Group, c.Key, c.Attempts, map[bool]string{true: "acknowledged", false: "discarded"}[d.acks > 0])
		}
		if ev := m.events[c.Key]; ev != nil && ev.okey != c.OrderingKey {
			m.errorf("%s: %s/%s claimed with ordering key %q, enqueued with %q", how, c.Group, c.Key, c.OrderingKey, ev.okey)
		}
		if c.OrderingKey == "" {
			if c.OrderingSeq != 0 {
				m.errorf("%s: unordered %s/%s has sequence number %d", how, c.Group, c.Key, c.OrderingSeq)
			}
			continue
		}
		if d.seq != 0 && d.seq != c.OrderingSeq {
			m.errorf("%s: %s/%s had sequence number %d, now %d", how, c.Group, c.Key, d.seq, c.OrderingSeq)
		}
		d.seq = c.OrderingSeq
		k := m.keyOf(c.Group, c.OrderingKey)
		if other, ok := k.bySeq[c.OrderingSeq]; ok && other != c.Key {
			m.errorf("%s: %s/%s and %s share sequence number %d of key %s", how, c.Group, c.Key, other, c.OrderingSeq, c.OrderingKey)
		}
		k.bySeq[c.OrderingSeq] = c.Key
		// At most one event of the key under a live claim.
		for tok, f := range k.inFlight {
			if f.key == c.Key || f.settling {
				continue
			}
			if f.expires.After(now.Add(leaseSlack)) {
				m.errorf("%s: %s/%s (seq %d) claimed while %s of key %s is claimed until %s (%s later)",
					how, c.Group, c.Key, c.OrderingSeq, f.key, c.OrderingKey, f.expires.Format(time.StampMicro), f.expires.Sub(now))
			} else if f.expires.Add(time.Minute).Before(now) {
				delete(k.inFlight, tok) // long abandoned
			}
		}
		k.inFlight[tokens[i]] = &flight{key: c.Key, expires: c.LeaseExpiresAt}
		// In sequence. Under skip a requeued dead letter rejoins its key
		// out of sequence; only the first pass of each event is checked.
		policy := policyOf(c.Group)
		if policy == outbox.DeadLetterSkip && d.requeues > 0 {
			continue
		}
		switch {
		case c.OrderingSeq == k.last:
		case c.OrderingSeq == k.last+1:
			if k.last > 0 {
				prev := m.delivery(c.Group, k.bySeq[k.last])
				if !settledBefore(prev, policy) {
					m.errorf("%s: %s/%s (seq %d) handed out while its predecessor %s is not settled: %+v",
						how, c.Group, c.Key, c.OrderingSeq, k.bySeq[k.last], *prev)
				}
			}
			k.last = c.OrderingSeq
		default:
			m.errorf("%s: %s/%s of key %s handed out with sequence number %d after %d",
				how, c.Group, c.Key, c.OrderingKey, c.OrderingSeq, k.last)
		}
	}
}

// settling marks claims as being settled by their holder.
func (m *orderModel) settling(cs []outbox.Claimed, tokens []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, c := range cs {
		if c.OrderingKey == "" {
			continue
		}
		if f := m.keyOf(c.Group, c.OrderingKey).inFlight[tokens[i]]; f != nil {
			f.settling = true
		}
	}
}

// settled drops claims the holder has settled (or learnt were stale).
func (m *orderModel) settled(cs []outbox.Claimed, tokens []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, c := range cs {
		if c.OrderingKey != "" {
			delete(m.keyOf(c.Group, c.OrderingKey).inFlight, tokens[i])
		}
	}
}

func (m *orderModel) startAcks(cs []outbox.Claimed) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, c := range cs {
		m.delivery(c.Group, c.Key).acking++
	}
}

// acked records the outcome of acknowledgements: stale holds the ids whose
// receipts were stale.
func (m *orderModel) acked(cs []outbox.Claimed, stale map[int64]bool, how string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, c := range cs {
		d := m.delivery(c.Group, c.Key)
		d.acking--
		if stale[c.ID] {
			continue
		}
		d.acks++
		m.acks.Add(1)
		if d.acks == 1 && !d.discarded {
			m.settledN.Add(1)
		}
		if d.acks > 1 {
			m.errorf("%s: %s/%s acknowledged %d times", how, c.Group, c.Key, d.acks)
		}
		if d.discarded {
			m.errorf("%s: %s/%s acknowledged after it was discarded", how, c.Group, c.Key)
		}
	}
}

// tokensOf names leased claims by their claim keys.
func tokensOf(cs []outbox.Claimed) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.ClaimKey
	}
	return out
}

func (m *orderModel) run(chaos time.Duration) {
	t := m.t
	stop := make(chan struct{})
	var producers, workers sync.WaitGroup
	const nProducers, consumersPerGroup = 3, 3
	for p := range nProducers {
		producers.Go(func() { m.produce(p, stop) })
	}
	done := make(chan struct{})
	for gi, g := range modelGroups {
		for w := range consumersPerGroup {
			held := m.dialect != "sqlite" && w == 0
			workers.Go(func() { m.consume(g.name, gi*consumersPerGroup+w, held, done) })
		}
	}
	workers.Go(func() { m.operate(done) })
	workers.Go(func() { m.checkDatabase(done) })

	began := time.Now()
	select {
	case <-time.After(chaos):
	case <-m.failedSoon(chaos):
	}
	close(stop)
	producers.Wait()
	m.calm.Store(true)
	calmAt := time.Now()

	// Every committed event settled in every group, or stuck: nothing
	// settled for stuckAfter.
	progress, progressAt := m.settledN.Load(), time.Now()
	for {
		left := m.unsettled()
		if len(left) == 0 || m.failed() {
			break
		}
		if n := m.settledN.Load(); n != progress {
			progress, progressAt = n, time.Now()
		}
		if time.Since(progressAt) > stuckAfter {
			m.fail("events never settled once failures stopped and dead letters were requeued or discarded (%d): %s\nrows: %s",
				len(left), strings.Join(left[:min(len(left), 20)], ", "), m.dumpRows())
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(done)
	workers.Wait()
	t.Logf("%d events committed; chaos %v, drained in %v; claims %d (handed over %d, held %d), acks %d, fails %d (dead %d), releases %d, abandoned %d, requeued %d, discarded %d, re-enqueued %d, rolled back %d, conflicts %d, producer deadlocks %d",
		len(m.committed), calmAt.Sub(began).Round(time.Millisecond), time.Since(calmAt).Round(time.Millisecond),
		m.claims.Load(), m.handedOver.Load(), m.held.Load(), m.acks.Load(), m.fails.Load(), m.deadLettered.Load(),
		m.releases.Load(), m.abandoned.Load(), m.requeued.Load(), m.discarded.Load(), m.reEnqueued.Load(), m.rolledBack.Load(), m.conflicts.Load(), m.deadlocks.Load())
	if !m.failed() {
		m.finalChecks()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, e := range m.errs {
		if i == 30 {
			t.Errorf("... and %d more", len(m.errs)-30)
			break
		}
		t.Error(e)
	}
}

// failedSoon closes when a violation has been recorded.
func (m *orderModel) failedSoon(within time.Duration) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		end := time.Now().Add(within)
		for time.Now().Before(end) {
			if m.failed() {
				close(ch)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	return ch
}

// unsettled lists the committed events some group has neither
// acknowledged nor discarded.
func (m *orderModel) unsettled() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, k := range m.committed {
		for _, g := range modelGroups {
			d := m.deliveries[[2]string{g.name, k}]
			if d == nil || (d.acks == 0 && !d.discarded) {
				state := "never claimed"
				if d != nil {
					state = fmt.Sprintf("%+v", *d)
				}
				out = append(out, fmt.Sprintf("%s/%s (key %q) %s", g.name, k, m.events[k].okey, state))
			}
		}
	}
	return out
}

// produce commits transactions of one to three events until stop closes.
func (m *orderModel) produce(p int, stop <-chan struct{}) {
	rng := m.rng(uint64(100 + p))
	n := 0
	okeys := []string{"k0", "k1", "k2", "k3"}
	for {
		select {
		case <-stop:
			return
		default:
		}
		time.Sleep(time.Duration(5+rng.IntN(25)) * time.Millisecond)
		if m.committedN.Load()*int64(len(modelGroups))-m.settledN.Load() > maxBacklog*int64(len(modelGroups)) {
			continue // let the consumers catch up
		}
		var batch []*modelEvent
		var known []*modelEvent
		for range 1 + rng.IntN(3) {
			switch r := rng.Float64(); {
			case r < 0.12:
				if k := m.someCommitted(rng); k != nil {
					known = append(known, k)
				}
			case r < 0.3:
				n++
				key := fmt.Sprintf("p%d-%d", p, n)
				batch = append(batch, &modelEvent{key: key, payload: []byte(`{"e":"` + key + `"}`)})
			default:
				n++
				key := fmt.Sprintf("p%d-%d", p, n)
				batch = append(batch, &modelEvent{key: key, okey: okeys[rng.IntN(len(okeys))], payload: []byte(`{"e":"` + key + `"}`)})
			}
		}
		// Keys in one order in every transaction (the documented way to
		// avoid deadlocks between producers of several keys).
		sort.SliceStable(batch, func(i, j int) bool { return batch[i].okey < batch[j].okey })
		rollback := rng.Float64() < 0.08
		again := len(batch) > 0 && rng.Float64() < 0.1 // enqueue one new event twice
		conflict := rng.Float64() < 0.03
		m.produceTx(rng, batch, known, rollback, again)
		if conflict {
			m.produceConflict(rng)
		}
	}
}

func (m *orderModel) someCommitted(rng *rand.Rand) *modelEvent {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.committed) == 0 {
		return nil
	}
	return m.events[m.committed[rng.IntN(len(m.committed))]]
}

// inTx runs fn in a producer's transaction: a pgx transaction on
// PostgreSQL, Store.InTx elsewhere (on SQLite it takes its turn in the
// store's write queue). A nil error from fn commits.
func (m *orderModel) inTx(fn func(ctx context.Context, tx outbox.Tx) error) error {
	if m.pool != nil {
		tx, err := m.pool.Begin(m.ctx)
		if err != nil {
			return err
		}
		if err := fn(m.ctx, outbox.PgxTx(tx)); err != nil {
			_ = tx.Rollback(m.ctx)
			return err
		}
		return tx.Commit(m.ctx)
	}
	return m.s.InTx(m.ctx, nil, func(ctx context.Context, tx *sql.Tx) error { return fn(ctx, outbox.SQLTx(tx)) })
}

var errRollback = errors.New("rolled back on purpose")

func (m *orderModel) produceTx(rng *rand.Rand, batch, known []*modelEvent, rollback, again bool) {
	txID := m.txSeq.Add(1)
	start := m.clock.Add(1)
	m.mu.Lock()
	for i, ev := range batch {
		ev.tx, ev.idx, ev.start = txID, int64(i), start
		m.events[ev.key] = ev
	}
	m.mu.Unlock()
	err := m.inTx(func(ctx context.Context, tx outbox.Tx) error {
		for i, ev := range batch {
			res, err := m.s.Enqueue(ctx, tx, outbox.Event{Stream: modelStream, Key: ev.key, Kind: "Model", Payload: ev.payload, OrderingKey: ev.okey})
			if err != nil {
				return err
			}
			if !res.Inserted {
				return fmt.Errorf("new event %s not inserted", ev.key)
			}
			if again && i == 0 {
				res, err := m.s.Enqueue(ctx, tx, outbox.Event{Stream: modelStream, Key: ev.key, Kind: "Model", Payload: ev.payload, OrderingKey: ev.okey})
				if err != nil || res.Inserted {
					return fmt.Errorf("event %s enqueued again in its transaction: %+v, %v", ev.key, res, err)
				}
			}
		}
		for _, ev := range known {
			res, err := m.s.Enqueue(ctx, tx, outbox.Event{Stream: modelStream, Key: ev.key, Kind: "Model", Payload: ev.payload, OrderingKey: ev.okey})
			if err != nil || res.Inserted {
				return fmt.Errorf("known event %s enqueued again: %+v, %v", ev.key, res, err)
			}
			m.reEnqueued.Add(1)
		}
		if rollback {
			return errRollback
		}
		return nil
	})
	commit := m.clock.Add(1)
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case err == nil:
		for _, ev := range batch {
			ev.commit = commit
			m.committed = append(m.committed, ev.key)
			m.committedN.Add(1)
		}
	case errors.Is(err, errRollback) || isDeadlock(err):
		if !errors.Is(err, errRollback) {
			m.deadlocks.Add(1)
			m.t.Logf("producer transaction %d (%d new, %d known events) deadlocked: %v", txID, len(batch), len(known), err)
		}
		m.rolledBack.Add(1)
		for _, ev := range batch {
			ev.rolledBack = true
		}
	default:
		for _, ev := range batch {
			ev.rolledBack = true // unknown, but a failed commit is a failure anyway
		}
		m.errorf("producer transaction %d: %v", txID, err)
	}
}

// produceConflict enqueues a known event key with other content, in a
// transaction it rolls back: ErrIdempotencyConflict.
func (m *orderModel) produceConflict(rng *rand.Rand) {
	ev := m.someCommitted(rng)
	if ev == nil {
		return
	}
	other := outbox.Event{Stream: modelStream, Key: ev.key, Kind: "Model", Payload: []byte(`{"other":1}`), OrderingKey: ev.okey}
	if rng.IntN(2) == 0 {
		other.Payload, other.OrderingKey = ev.payload, ev.okey+"x"
	}
	err := m.inTx(func(ctx context.Context, tx outbox.Tx) error {
		_, err := m.s.Enqueue(ctx, tx, other)
		if !errors.Is(err, outbox.ErrIdempotencyConflict) {
			return fmt.Errorf("conflicting enqueue of %s: %v, want ErrIdempotencyConflict", ev.key, err)
		}
		return errRollback
	})
	if !errors.Is(err, errRollback) && !isDeadlock(err) {
		m.fail("%v", err)
	}
	m.conflicts.Add(1)
}

func isDeadlock(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "40P01" || pgErr.Code == "40001"
	}
	// MariaDB reports a transaction chosen as the deadlock's victim while
	// it waited for the table's AUTO-INC lock as 1467 (failed to read the
	// auto-increment value); the transaction is rolled back all the same.
	return err != nil && (strings.Contains(err.Error(), "Error 1213") || strings.Contains(err.Error(), "Error 1467"))
}

// consume claims for group until done closes. A held consumer (PostgreSQL, MySQL)
// takes half its claims with ClaimHeld.
func (m *orderModel) consume(group string, w int, held bool, done <-chan struct{}) {
	rng := m.rng(uint64(200 + w))
	req := outbox.ClaimRequest{Stream: modelStream, Group: group, Worker: "w" + strconv.Itoa(w), Lease: modelLease,
		MaxAttempts: modelAttempts, DeadLetterPolicy: policyOf(group)}
	var carry []outbox.Claimed // handed over by the last acknowledgement
	for {
		select {
		case <-done:
			if len(carry) > 0 {
				m.settling(carry, tokensOf(carry))
				_, _ = m.s.Release(m.ctx, receipts(carry)...)
				m.settled(carry, tokensOf(carry))
			}
			return
		default:
		}
		req.Limit = 1 + rng.IntN(6)
		if len(carry) == 0 && held && rng.IntN(2) == 0 {
			m.consumeHeld(rng, req)
			continue
		}
		got := carry
		carry = nil
		if len(got) == 0 {
			cs, err := m.s.Claim(m.ctx, req)
			if err != nil {
				m.fail("claim %s: %v", group, err)
				return
			}
			m.claims.Add(int64(len(cs)))
			m.claimed(cs, tokensOf(cs), "claim")
			got = cs
		}
		if len(got) == 0 {
			time.Sleep(time.Duration(1+rng.IntN(4)) * time.Millisecond)
			continue
		}
		time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond) // handling
		var acks []outbox.Claimed
		for _, c := range got {
			if m.calm.Load() {
				acks = append(acks, c)
				continue
			}
			switch r := rng.Float64(); {
			case r < 0.6:
				acks = append(acks, c)
			case r < 0.85:
				m.failOne(rng, c)
			case r < 0.93:
				m.settling([]outbox.Claimed{c}, tokensOf([]outbox.Claimed{c}))
				if _, err := m.s.Release(m.ctx, c.Receipt()); err != nil {
					m.fail("release: %v", err)
				}
				m.settled([]outbox.Claimed{c}, tokensOf([]outbox.Claimed{c}))
				m.releases.Add(1)
			case r < 0.97:
				// Acknowledged after its lease: stale, unless it ran out
				// only just (the database's clock decides).
				time.Sleep(modelLease + 50*time.Millisecond)
				acks = append(acks, c)
			default:
				m.abandoned.Add(1) // its lease expires
			}
		}
		if len(acks) == 0 {
			continue
		}
		m.startAcks(acks)
		m.settling(acks, tokensOf(acks))
		rs := receipts(acks)
		var stale []outbox.Receipt
		var err error
		how := "ack"
		if rng.IntN(3) > 0 {
			how = "hand-over"
			hreq := req
			hreq.Limit = 1 + rng.IntN(4)
			carry, stale, err = m.s.AcknowledgeAndClaimNext(m.ctx, rs, hreq)
		} else {
			stale, err = m.s.AcknowledgeBatch(m.ctx, rs)
		}
		if err != nil {
			m.fail("%s %s: %v", how, group, err)
			return
		}
		staleIDs := map[int64]bool{}
		for _, r := range stale {
			staleIDs[r.ID] = true
		}
		m.acked(acks, staleIDs, how)
		m.settled(acks, tokensOf(acks))
		if len(carry) > 0 {
			m.handedOver.Add(int64(len(carry)))
			m.claims.Add(int64(len(carry)))
			m.claimed(carry, tokensOf(carry), "hand-over")
			for _, c := range carry {
				if c.Group != group {
					m.fail("hand-over of group %s to a consumer of %s", c.Group, group)
				}
			}
		}
	}
}

func receipts(cs []outbox.Claimed) []outbox.Receipt { return receiptsOfClaims(cs) }

// sqlRowsCloser gives *sql.Rows pgx's Close without a result.
type sqlRowsCloser struct{ *sql.Rows }

func (r sqlRowsCloser) Close() { _ = r.Rows.Close() }

func (m *orderModel) failOne(rng *rand.Rand, c outbox.Claimed) {
	one := []outbox.Claimed{c}
	m.settling(one, tokensOf(one))
	final := c.Attempts >= modelAttempts
	if final {
		m.mu.Lock()
		m.delivery(c.Group, c.Key).failing = true
		m.mu.Unlock()
	}
	out, err := m.s.Fail(m.ctx, c.Receipt(), outbox.Failure{Reason: "model failure", MaxAttempts: modelAttempts,
		RetryDelay: time.Duration(rng.IntN(30)) * time.Millisecond, DeadLetterPolicy: policyOf(c.Group)})
	switch {
	case errors.Is(err, outbox.ErrStaleClaim):
	case err != nil:
		m.fail("fail %s: %v", c.Group, err)
	default:
		m.fails.Add(1)
		if out.DeadLettered != final {
			m.fail("fail of %s/%s at attempt %d: dead-lettered %v", c.Group, c.Key, c.Attempts, out.DeadLettered)
		}
		if out.DeadLettered {
			m.deadLettered.Add(1)
			m.mu.Lock()
			m.delivery(c.Group, c.Key).dead = true
			m.mu.Unlock()
		}
	}
	m.settled(one, tokensOf(one))
}

// consumeHeld takes one held claim and settles it: each event delivered,
// leased (then acknowledged or failed) or left due; or the claim aborted.
func (m *orderModel) consumeHeld(rng *rand.Rand, req outbox.ClaimRequest) {
	h, cs, err := m.s.ClaimHeld(m.ctx, req)
	if err != nil {
		m.fail("held claim %s: %v", req.Group, err)
		return
	}
	if h == nil {
		time.Sleep(time.Duration(1+rng.IntN(4)) * time.Millisecond)
		return
	}
	tokens := make([]string, len(cs))
	for i := range cs {
		tokens[i] = "held-" + strconv.FormatInt(m.tokSeq.Add(1), 10)
	}
	m.held.Add(int64(len(cs)))
	m.claims.Add(int64(len(cs)))
	m.claimed(cs, tokens, "held claim")
	time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
	m.settling(cs, tokens)
	if !m.calm.Load() && rng.Float64() < 0.1 {
		if err := h.Abort(); err != nil {
			m.fail("abort held claim: %v", err)
		}
		m.settled(cs, tokens)
		return
	}
	var delivered, leased []outbox.Claimed
	for _, c := range cs {
		switch r := rng.Float64(); {
		case m.calm.Load() || r < 0.6:
			delivered = append(delivered, c)
		case r < 0.85:
			leased = append(leased, c)
		}
	}
	m.startAcks(delivered)
	rs, err := h.Settle(m.ctx, ids(delivered), ids(leased))
	if err != nil {
		m.fail("settle held claim: %v", err)
		m.acked(delivered, nil, "held settle")
		return
	}
	m.acked(delivered, nil, "held settle")
	if len(rs) != len(leased) {
		m.fail("settle leased %d events, want %d", len(rs), len(leased))
		return
	}
	// The leased ones are ordinary claims now, the rest due again.
	for i := range leased {
		if rs[i].ID != leased[i].ID {
			m.fail("settle: receipt %d for event row %d", rs[i].ID, leased[i].ID)
			return
		}
		// Held, the attempt was not counted; leased, it is.
		leased[i].ClaimKey = rs[i].ClaimKey
		leased[i].LeaseExpiresAt = time.Now().Add(modelLease)
	}
	m.claimed(leased, tokensOf(leased), "held lease")
	m.settled(cs, tokens)
	for _, c := range leased {
		if rng.IntN(2) == 0 {
			m.failOne(rng, c)
			continue
		}
		one := []outbox.Claimed{c}
		m.startAcks(one)
		m.settling(one, tokensOf(one))
		stale, err := m.s.AcknowledgeBatch(m.ctx, receipts(one))
		if err != nil {
			m.fail("ack of a held event: %v", err)
		}
		staleIDs := map[int64]bool{}
		for _, r := range stale {
			staleIDs[r.ID] = true
		}
		m.acked(one, staleIDs, "held ack")
		m.settled(one, tokensOf(one))
	}
}

// operate lists dead letters and requeues or discards some of them (once
// failures have stopped, all of them) until done closes. An event is
// discarded in one group at most, so it keeps a row and a re-enqueue of its
// key stays idempotent.
func (m *orderModel) operate(done <-chan struct{}) {
	rng := m.rng(300)
	for {
		select {
		case <-done:
			return
		case <-time.After(time.Duration(20+rng.IntN(60)) * time.Millisecond):
		}
		dead, err := m.s.ListDead(m.ctx, outbox.DeadQuery{Stream: modelStream, AllGroups: true, Limit: 1000})
		if err != nil {
			m.fail("list dead: %v", err)
			return
		}
		for _, d := range dead {
			calm := m.calm.Load()
			r := rng.Float64()
			if !calm && r < 0.3 {
				continue // left dead for now
			}
			m.mu.Lock()
			md := m.delivery(d.Group, d.Key)
			md.dead = true
			if md.acks > 0 { // (an acknowledgement under way may be a stale one)
				m.errorf("dead letter %s/%s was acknowledged", d.Group, d.Key)
			}
			discard := r > 0.65
			for _, g := range modelGroups {
				if o := m.deliveries[[2]string{g.name, d.Key}]; g.name != d.Group && o != nil && (o.discarding || o.discarded) {
					discard = false
				}
			}
			if discard {
				md.discarding = true
			} else {
				md.requeues++
				md.dead, md.failing = false, false
			}
			m.mu.Unlock()
			if discard {
				n, err := m.s.DiscardDead(m.ctx, outbox.DeadSelector{Stream: modelStream, IDs: []int64{d.ID}})
				m.mu.Lock()
				if err != nil || n != 1 {
					m.errorf("discard dead letter %s/%s: %d, %v", d.Group, d.Key, n, err)
				}
				md.discarded = n == 1
				if md.discarded && md.acks == 0 {
					m.settledN.Add(1)
				}
				if md.acks > 0 {
					m.errorf("discarded %s/%s had been acknowledged", d.Group, d.Key)
				}
				m.mu.Unlock()
				m.discarded.Add(1)
				continue
			}
			n, err := m.s.Requeue(m.ctx, modelStream, d.ID)
			if err != nil || n != 1 {
				m.fail("requeue dead letter %s/%s: %d, %v", d.Group, d.Key, n, err)
			}
			m.requeued.Add(1)
		}
	}
}

// checkDatabase checks the key rows against the delivery rows, in one
// statement (one snapshot), until done closes.
func (m *orderModel) checkDatabase(done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		case <-time.After(100 * time.Millisecond):
		}
		if msg := m.checkKeys(); msg != "" {
			m.fail("%s", msg)
			return
		}
	}
}

// checkKeys returns a description of what is wrong with the key rows, or "".
func (m *orderModel) checkKeys() string {
	released := "d.key_released <> 0"
	if m.dialect == "postgres" {
		released = "d.key_released"
	}
	sub := func(cond string) string {
		return `(SELECT COUNT(*) FROM millpond_deliveries d WHERE d.stream = o.stream AND d.consumer_group = o.consumer_group
  AND d.ordering_key = o.ordering_key AND ` + cond + `)`
	}
	query := `SELECT o.consumer_group, o.ordering_key, o.unsettled, ` +
		sub("d.status IN ('pending', 'processing')") + `, ` +
		sub("d.status = 'blocked'") + `, ` +
		sub("d.status = 'dead_letter' AND NOT ("+released+")") + `
FROM millpond_ordering o WHERE o.stream = 'm' ORDER BY o.consumer_group, o.ordering_key`
	type keyRow struct {
		group, okey                    string
		unsettled, live, blocked, hold int64
	}
	var out []keyRow
	scan := func(next func() bool, scan func(...any) error) error {
		for next() {
			var r keyRow
			if err := scan(&r.group, &r.okey, &r.unsettled, &r.live, &r.blocked, &r.hold); err != nil {
				return err
			}
			out = append(out, r)
		}
		return nil
	}
	var err error
	if m.pool != nil {
		rows, qerr := m.pool.Query(m.ctx, query)
		if qerr != nil {
			return fmt.Sprintf("key check: %v", qerr)
		}
		err = scan(rows.Next, rows.Scan)
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	} else {
		rows, qerr := m.db.SQL.QueryContext(m.ctx, query)
		if qerr != nil {
			return fmt.Sprintf("key check: %v", qerr)
		}
		err = scan(rows.Next, rows.Scan)
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	if err != nil {
		return fmt.Sprintf("key check: %v", err)
	}
	var bad []string
	for _, r := range out {
		heads := r.live + r.hold
		if heads > 1 || (r.blocked > 0 && heads != 1) || r.unsettled != r.live+r.blocked+r.hold {
			bad = append(bad, fmt.Sprintf("%s/%s: unsettled %d, pending or processing %d, blocked %d, dead holding %d",
				r.group, r.okey, r.unsettled, r.live, r.blocked, r.hold))
		}
	}
	if len(bad) > 0 {
		return "key rows disagree with their events: " + strings.Join(bad, "; ") + "\nrows: " + m.dumpRows()
	}
	return ""
}

// dumpRows lists the unsettled ordered delivery rows, for a failure's
// message.
func (m *orderModel) dumpRows() string {
	query := `SELECT d.id, d.consumer_group, d.ordering_key, d.ordering_seq, d.status, d.attempts, d.available_at
FROM millpond_deliveries d WHERE d.stream = 'm' AND d.status <> 'delivered' ORDER BY d.consumer_group, d.ordering_key, d.ordering_seq LIMIT 60`
	var b strings.Builder
	var rows interface {
		Next() bool
		Scan(...any) error
		Close()
	}
	if m.pool != nil {
		r, err := m.pool.Query(m.ctx, query)
		if err != nil {
			return err.Error()
		}
		rows = r
	} else {
		r, err := m.db.SQL.QueryContext(m.ctx, query)
		if err != nil {
			return err.Error()
		}
		rows = sqlRowsCloser{r}
	}
	defer rows.Close()
	for rows.Next() {
		var id, seq, attempts, avail int64
		var group, okey, status string
		if err := rows.Scan(&id, &group, &okey, &seq, &status, &attempts, &avail); err != nil {
			return err.Error()
		}
		fmt.Fprintf(&b, "\n  %d %s/%s seq %d %s attempts %d available %d", id, group, okey, seq, status, attempts, avail)
	}
	return b.String()
}

// finalChecks compares the whole history with what was committed, and the
// database with a drained outbox.
func (m *orderModel) finalChecks() {
	m.mu.Lock()
	defer m.mu.Unlock()
	// Nothing but committed events was handed out.
	for dk, d := range m.deliveries {
		ev := m.events[dk[1]]
		if d.claims > 0 && (ev == nil || ev.commit == 0) {
			m.errorf("%s/%s was handed out but never committed (%+v)", dk[0], dk[1], ev)
		}
	}
	// Per key: sequence numbers 1..N, the same in both groups, in commit
	// order.
	byKey := map[string][]*modelEvent{}
	for _, k := range m.committed {
		ev := m.events[k]
		if ev.okey != "" {
			byKey[ev.okey] = append(byKey[ev.okey], ev)
		}
	}
	for okey, evs := range byKey {
		for _, g := range modelGroups {
			seqs := make([]int64, 0, len(evs))
			for _, ev := range evs {
				seqs = append(seqs, m.deliveries[[2]string{g.name, ev.key}].seq)
			}
			sorted := slices.Clone(seqs)
			slices.Sort(sorted)
			for i, s := range sorted {
				if s != int64(i+1) {
					m.errorf("%s/%s: sequence numbers of %d committed events are %v, want 1..%d", g.name, okey, len(evs), sorted, len(evs))
					break
				}
			}
		}
		for i, x := range evs {
			sx := m.deliveries[[2]string{modelGroups[0].name, x.key}].seq
			if sy := m.deliveries[[2]string{modelGroups[1].name, x.key}].seq; sy != sx {
				m.errorf("%s: sequence number %d in %s, %d in %s", x.key, sx, modelGroups[0].name, sy, modelGroups[1].name)
			}
			for _, y := range evs[i+1:] {
				sy := m.deliveries[[2]string{modelGroups[0].name, y.key}].seq
				before := x.commit < y.start || (x.tx == y.tx && x.idx < y.idx)
				after := y.commit < x.start || (x.tx == y.tx && y.idx < x.idx)
				if (before && sx > sy) || (after && sy > sx) {
					m.errorf("key %s: %s (tx %d, committed at %d, seq %d) and %s (tx %d, began at %d, seq %d) out of commit order",
						okey, x.key, x.tx, x.commit, sx, y.key, y.tx, y.start, sy)
				}
			}
		}
	}
	// Exactly one acknowledgement or a discard per committed event and group.
	acked := int64(0)
	for _, k := range m.committed {
		for _, g := range modelGroups {
			d := m.deliveries[[2]string{g.name, k}]
			switch {
			case d.acks == 1 && !d.discarded:
				acked++
			case d.acks == 0 && d.discarded:
			default:
				m.errorf("%s/%s: acknowledged %d times, discarded %v", g.name, k, d.acks, d.discarded)
			}
		}
	}
	// The database agrees: nothing left, no key counting an event.
	m.mu.Unlock()
	defer m.mu.Lock()
	var n int64
	if m.pool != nil {
		if err := m.pool.QueryRow(m.ctx, "SELECT COUNT(*) FROM millpond_deliveries WHERE status <> 'delivered'").Scan(&n); err != nil {
			m.fail("count rows: %v", err)
		}
	} else if err := m.db.SQL.QueryRow("SELECT COUNT(*) FROM millpond_deliveries WHERE status <> 'delivered'").Scan(&n); err != nil {
		m.fail("count rows: %v", err)
	}
	if n != 0 {
		m.fail("%d delivery rows left undelivered: %s", n, m.dumpRows())
	}
	var delivered, keysLeft int64
	countInto := func(query string, dst *int64) {
		var err error
		if m.pool != nil {
			err = m.pool.QueryRow(m.ctx, query).Scan(dst)
		} else {
			err = m.db.SQL.QueryRow(query).Scan(dst)
		}
		if err != nil {
			m.fail("%s: %v", query, err)
		}
	}
	countInto("SELECT COUNT(*) FROM millpond_deliveries WHERE status = 'delivered'", &delivered)
	countInto("SELECT COUNT(*) FROM millpond_ordering WHERE unsettled <> 0", &keysLeft)
	want := acked
	if m.deleteOnAck {
		want = 0
	}
	if delivered != want {
		m.fail("%d delivered rows, want %d", delivered, want)
	}
	if keysLeft != 0 {
		m.fail("%d keys still count unsettled events", keysLeft)
	}
	if msg := m.checkKeys(); msg != "" {
		m.fail("%s", msg)
	}
}
