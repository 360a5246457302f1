package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// payloadSize is the approximate size of an event payload in bytes.
const payloadSize = 200

// makePayload returns a JSON event payload of about payloadSize bytes that
// carries the event id.
func makePayload(id int64) []byte { return makePayloadSize(id, payloadSize) }

// makePayloadSize returns a JSON event payload of about size bytes that
// carries the event id.
func makePayloadSize(id int64, size int) []byte {
	b := make([]byte, 0, size+8)
	b = append(b, `{"id":`...)
	b = strconv.AppendInt(b, id, 10)
	b = append(b, `,"pad":"`...)
	for len(b) < size-2 {
		b = append(b, 'x')
	}
	return append(b, `"}`...)
}

// payloadID extracts the event id from a payload made by makePayload. The
// payload may have been re-serialized by the system (e.g. stored as jsonb).
func payloadID(payload []byte) (int64, error) {
	var v struct {
		ID int64 `json:"id"`
	}
	if err := json.Unmarshal(payload, &v); err != nil {
		return 0, err
	}
	return v.ID, nil
}

// enqueueFunc writes one event inside tx.
type enqueueFunc func(ctx context.Context, tx *benchTx, payload []byte) error

// rawInsertEnqueue is the baseline: the event is a plain INSERT into a plain
// table, the least any transactional outbox can cost.
func rawInsertEnqueue(ctx context.Context, tx *benchTx, payload []byte) error {
	if tx.d.rawInsert != nil {
		_, err := tx.sql.StmtContext(ctx, tx.d.rawInsert).ExecContext(ctx, payload)
		return err
	}
	return tx.exec(ctx, `INSERT INTO bench_plain_events (payload) VALUES (`+tx.d.ph(1)+`)`, payload)
}

// rawInsertSQL is the raw INSERT baseline's statement on SQLite.
const rawInsertSQL = `INSERT INTO bench_plain_events (payload) VALUES (?)`

// produceOne runs one producer transaction: a domain row and an event,
// committed together.
func produceOne(ctx context.Context, db *database, enqueue enqueueFunc, id int64, size int) error {
	return db.inTx(ctx, func(ctx context.Context, tx *benchTx) error {
		if err := tx.exec(ctx, `INSERT INTO bench_orders (payload) VALUES (`+db.ph(1)+`)`, "order "+strconv.FormatInt(id, 10)); err != nil {
			return fmt.Errorf("insert order: %w", err)
		}
		if err := enqueue(ctx, tx, makePayloadSize(id, size)); err != nil {
			return fmt.Errorf("enqueue: %w", err)
		}
		return nil
	})
}

// runProducers enqueues events firstID..firstID+n-1 as fast as producers
// concurrent transactions allow, and returns the elapsed time. If committed
// is non-nil, committed(id) is called right after each Commit returns.
func runProducers(ctx context.Context, db *database, producers int, enqueue enqueueFunc, firstID int64, n int, ids <-chan int64, committed func(id int64)) (time.Duration, error) {
	return runProducersSize(ctx, db, producers, enqueue, firstID, n, ids, committed, payloadSize)
}

// runProducersSize is runProducers with payloads of about size bytes.
func runProducersSize(ctx context.Context, db *database, producers int, enqueue enqueueFunc, firstID int64, n int, ids <-chan int64, committed func(id int64), size int) (time.Duration, error) {
	if ids == nil {
		ch := make(chan int64, n)
		for i := range n {
			ch <- firstID + int64(i)
		}
		close(ch)
		ids = ch
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	start := time.Now()
	var wg sync.WaitGroup
	for range producers {
		wg.Go(func() {
			for id := range ids {
				if ctx.Err() != nil {
					return
				}
				if err := produceOne(ctx, db, enqueue, id, size); err != nil {
					cancel(fmt.Errorf("event %d: %w", id, err))
					return
				}
				if committed != nil {
					committed(id)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return elapsed, err
	}
	return elapsed, ctx.Err()
}

// paced sends n ids starting at firstID at rate per second on the returned
// channel, closing it when done or when ctx ends. The channel is buffered so
// slow producers do not slow the schedule.
func paced(ctx context.Context, firstID int64, n, rate int) <-chan int64 {
	ch := make(chan int64, n)
	go func() {
		defer close(ch)
		start := time.Now()
		interval := time.Second / time.Duration(rate)
		for i := range n {
			if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
				sleep(ctx, d)
			}
			if ctx.Err() != nil {
				return
			}
			ch <- firstID + int64(i)
		}
	}()
	return ch
}

// tracker records, for events 1..n, how often each was handled, when it was
// first handled and when its producer's Commit returned. Times are
// monotonic nanoseconds since the tracker was made.
type tracker struct {
	epoch     time.Time
	counts    []atomic.Int32
	firstSeen []atomic.Int64
	committed []atomic.Int64
	distinct  atomic.Int64
	total     atomic.Int64
	unknown   atomic.Int64
}

func newTracker(n int) *tracker {
	return &tracker{
		epoch:     time.Now(),
		counts:    make([]atomic.Int32, n),
		firstSeen: make([]atomic.Int64, n),
		committed: make([]atomic.Int64, n),
	}
}

func (t *tracker) now() int64 { return int64(time.Since(t.epoch)) }

// handle is the Handler given to systems.
func (t *tracker) handle(payload []byte) {
	id, err := payloadID(payload)
	if err != nil {
		t.unknown.Add(1)
		return
	}
	t.handleID(id)
}

// handleID records that event id was handled, for systems that decode the
// payload themselves (the bus's typed handlers).
func (t *tracker) handleID(id int64) {
	now := t.now()
	if id < 1 || id > int64(len(t.counts)) {
		t.unknown.Add(1)
		return
	}
	t.total.Add(1)
	if t.counts[id-1].Add(1) == 1 {
		t.firstSeen[id-1].Store(now)
		t.distinct.Add(1)
	}
}

// markCommitted records that event id's transaction has committed.
func (t *tracker) markCommitted(id int64) {
	if id >= 1 && id <= int64(len(t.committed)) {
		t.committed[id-1].Store(t.now())
	}
}

// waitDistinct waits until at least n distinct events were handled, polling
// every millisecond, or until timeout.
func (t *tracker) waitDistinct(ctx context.Context, n int64, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for t.distinct.Load() < n {
		if ctx.Err() != nil || time.Now().After(deadline) {
			return false
		}
		sleep(ctx, time.Millisecond)
	}
	return true
}

// lastFirstSeen returns the latest first-handled time among events
// first..first+n-1, as a duration since the epoch.
func (t *tracker) lastFirstSeen(first int64, n int) time.Duration {
	var last int64
	for i := first - 1; i < first-1+int64(n); i++ {
		last = max(last, t.firstSeen[i].Load())
	}
	return time.Duration(last)
}

// firstFirstSeen returns the earliest first-handled time among events
// first..first+n-1, as a duration since the epoch (0 if none was handled).
func (t *tracker) firstFirstSeen(first int64, n int) time.Duration {
	var early int64
	for i := first - 1; i < first-1+int64(n); i++ {
		if v := t.firstSeen[i].Load(); v > 0 && (early == 0 || v < early) {
			early = v
		}
	}
	return time.Duration(early)
}

// latencies returns commit-to-handle latencies of the events
// first..first+n-1 that were both committed and handled, sorted.
func (t *tracker) latencies(first int64, n int) []time.Duration {
	out := make([]time.Duration, 0, n)
	for i := first - 1; i < first-1+int64(n); i++ {
		c, s := t.committed[i].Load(), t.firstSeen[i].Load()
		if c == 0 || t.counts[i].Load() == 0 {
			continue
		}
		// A consumer can see the row before the producer's Commit call
		// has returned; that counts as zero latency.
		out = append(out, time.Duration(max(0, s-c)))
	}
	slices.Sort(out)
	return out
}

// percentile returns the p-th percentile (0..100) of sorted durations.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p/100*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
