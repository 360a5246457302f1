package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/outbox/postgres"
)

// The enqueue breakdown writes the same event into millpond's table with
// statements that add one of the enqueue's duties at a time, so the cost of
// each duty is measured rather than guessed. The last step is the library
// itself.
const breakdownInsert = `WITH ev AS (
  INSERT INTO millpond_events (stream, event_key, event_kind, payload, metadata, content_hash, created_at)
  VALUES ($1, $2, $3, $4, $5, $6, $7)%s
  RETURNING id)
INSERT INTO millpond_deliveries (event_id, stream, consumer_group, status, available_at)
SELECT id, $1, '', 'pending', $7 FROM ev`

// breakdownStep is one statement of the breakdown.
type breakdownStep struct {
	name  string // shown in the table
	adds  string // the duty this step adds over the previous one
	query string // run with (stream, key, kind, payload, metadata, hash, now); empty for the Store
}

var breakdownSteps = []breakdownStep{
	{
		name:  "event row and delivery row, plain INSERTs",
		adds:  "the event and delivery rows and their indexes (primary keys, idempotency key, due events)",
		query: fmt.Sprintf(breakdownInsert, ""),
	},
	{
		name:  "+ ON CONFLICT DO NOTHING RETURNING id",
		adds:  "racing enqueues of one key resolve without failing the caller's transaction; idempotency and the content check",
		query: fmt.Sprintf(breakdownInsert, "\n  ON CONFLICT (stream, event_key) DO NOTHING") + "\nRETURNING id",
	},
	{
		name: "millpond outbox.Store.Enqueue",
		adds: "a row per subscribed consumer group (the subscriptions read), validation, content hash, the debounced NOTIFY",
	},
}

// breakdownRounds is how many raw/step slice pairs each step takes.
const breakdownRounds = 7

// runBreakdown measures every breakdown step against the raw INSERT and
// prints (and optionally writes) a markdown table.
func runBreakdown(ctx context.Context, db *database, cfg config, env string) error {
	store, err := postgres.New(db.pool)
	if err != nil {
		return err
	}
	if err := store.MigrateDown(ctx); err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	slice := max(cfg.events/breakdownRounds, 1)
	type measured struct {
		step   breakdownStep
		ratios []float64
	}
	var results []measured
	for _, step := range breakdownSteps {
		enqueue := breakdownEnqueue(store, step)
		if err := db.truncate(ctx, "millpond_outbox", "millpond_subscriptions", "bench_orders"); err != nil {
			return err
		}
		m := measured{step: step}
		for round := range breakdownRounds {
			baseRate, err := measureBaseline(ctx, db, cfg.producers, slice)
			if err != nil {
				return fmt.Errorf("breakdown: baseline: %w", err)
			}
			if err := db.checkpoint(ctx); err != nil {
				return err
			}
			elapsed, err := runProducers(ctx, db, cfg.producers, enqueue, int64(round*slice+1), slice, nil, nil)
			if err != nil {
				return fmt.Errorf("breakdown: %s: %w", step.name, err)
			}
			m.ratios = append(m.ratios, baseRate/(float64(slice)/elapsed.Seconds()))
		}
		slices.Sort(m.ratios)
		logf("breakdown: %s: %.2fx raw INSERT (rounds %.2f)", step.name, median(slices.Clone(m.ratios)), m.ratios)
		results = append(results, m)
	}

	var b strings.Builder
	fmt.Fprintf(&b, "# millpond enqueue breakdown\n\nRun %s. %s.\n\n", time.Now().UTC().Format(time.RFC3339), env)
	fmt.Fprintf(&b, "Each transaction inserts one domain row and one ~%d-byte event, %d producers. Every step is measured "+
		"in %d slices of %d events, each right after a raw INSERT slice of the same size (a one-index table); "+
		"the cost is the median of the per-slice ratios raw ev/s ÷ step ev/s, with the range.\n\n",
		payloadSize, cfg.producers, breakdownRounds, slice)
	b.WriteString("| step | cost vs raw INSERT | range | over the previous step | what the step adds |\n|---|---:|---:|---:|---|\n")
	prev := 1.0
	for _, m := range results {
		cost := median(slices.Clone(m.ratios))
		fmt.Fprintf(&b, "| %s | %.2fx | %.2f–%.2f | %+.2f | %s |\n", m.step.name, cost, m.ratios[0], m.ratios[len(m.ratios)-1], cost-prev, m.step.adds)
		prev = cost
	}
	md := b.String()
	return emit(md, cfg.out)
}

// breakdownEnqueue returns the enqueue function of one step.
func breakdownEnqueue(store *outbox.Store, step breakdownStep) enqueueFunc {
	if step.query == "" {
		return func(ctx context.Context, tx *benchTx, payload []byte) error {
			_, err := store.Enqueue(ctx, tx.outbox(), outbox.Event{Stream: millpondStream, Key: uuid.NewString(), Kind: "bench_event", Payload: payload})
			return err
		}
	}
	return func(ctx context.Context, tx *benchTx, payload []byte) error {
		hash := sha256.Sum256(payload)
		rows, err := tx.pgx.Query(ctx, step.query, millpondStream, uuid.NewString(), "bench_event", payload, "{}", hash[:], time.Now().UnixMicro())
		if err != nil {
			return err
		}
		rows.Close()
		return rows.Err()
	}
}
