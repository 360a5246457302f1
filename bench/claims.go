package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/millpond/millpond/outbox"
)

// The claim-cost mode (-claim-cost) times one claim (batch 100) on streams
// that hold large backlogs of events with ordering keys, against streams
// that hold as many claimable events without them: a claim must not walk
// the events blocked behind their keys' heads (issue 11).

// claimScenario is one stream the claim-cost mode fills and claims from.
type claimScenario struct {
	name   string
	stream string
	events int
	keys   int  // 0: no ordering keys
	head   bool // claim the one head first, so that only blocked events remain
}

func claimScenarios(events, keys int) []claimScenario {
	return []claimScenario{
		{name: fmt.Sprintf("%d events over %d ordering keys (%d claimable heads, the rest blocked)", events, keys, keys), stream: "claims-ordered", events: events, keys: keys},
		{name: fmt.Sprintf("%d events without ordering keys (as many claimable)", keys), stream: "claims-plain", events: keys},
		{name: fmt.Sprintf("%d events without ordering keys", events), stream: "claims-plain-all", events: events},
		{name: "10000 events on one ordering key, its head claimed (nothing claimable)", stream: "claims-one-key", events: 10_000, keys: 1, head: true},
		{name: "empty stream", stream: "claims-empty"},
	}
}

// claimBatch is the batch size of the timed claims.
const claimBatch = 100

// claimRepeats is how many claims each scenario times (the median is
// reported).
const claimRepeats = 31

func runClaimCost(ctx context.Context, db *database, cfg config, env string) error {
	store, err := db.store(outbox.WithoutListen())
	if err != nil {
		return err
	}
	if err := store.MigrateDown(ctx); err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	if err := db.truncate(ctx, "millpond_outbox", "millpond_subscriptions", "millpond_ordering"); err != nil {
		return err
	}
	scenarios := claimScenarios(cfg.claimEvents, cfg.claimKeys)
	for _, sc := range scenarios {
		start := time.Now()
		if err := fillClaimStream(ctx, db, store, sc); err != nil {
			return fmt.Errorf("claim cost: fill %s: %w", sc.stream, err)
		}
		logf("claim cost: %s filled in %s", sc.stream, time.Since(start).Round(time.Millisecond))
	}
	if err := db.analyze(ctx); err != nil {
		return err
	}
	type measured struct {
		sc      claimScenario
		claimed int
		median  time.Duration
		p90     time.Duration
	}
	var results []measured
	for _, sc := range scenarios {
		req := outbox.ClaimRequest{Stream: sc.stream, Worker: "claims", Limit: claimBatch, Lease: time.Minute, MaxAttempts: 100}
		if sc.head {
			if got, err := store.Claim(ctx, outbox.ClaimRequest{Stream: sc.stream, Worker: "head", Limit: claimBatch, Lease: time.Hour, MaxAttempts: 100}); err != nil || len(got) != 1 {
				return fmt.Errorf("claim cost: %s: claimed %d heads (%v), want 1", sc.stream, len(got), err)
			}
		}
		var ds []time.Duration
		claimed := 0
		for i := range claimRepeats + 3 {
			t0 := time.Now()
			got, err := store.Claim(ctx, req)
			d := time.Since(t0)
			if err != nil {
				return fmt.Errorf("claim cost: %s: %w", sc.stream, err)
			}
			if i >= 3 { // the first claims warm the caches and plans
				ds = append(ds, d)
				claimed = len(got)
			}
			if len(got) > 0 {
				rs := make([]outbox.Receipt, len(got))
				for j, c := range got {
					rs[j] = c.Receipt()
				}
				if _, err := store.Release(ctx, rs...); err != nil {
					return fmt.Errorf("claim cost: %s: release: %w", sc.stream, err)
				}
			}
		}
		slices.Sort(ds)
		m := measured{sc: sc, claimed: claimed, median: ds[len(ds)/2], p90: ds[len(ds)*9/10]}
		logf("claim cost: %s: median %s", sc.stream, m.median)
		results = append(results, m)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# millpond claim cost with blocked backlogs\n\nRun %s. %s.\n\n", time.Now().UTC().Format(time.RFC3339), env)
	fmt.Fprintf(&b, "One claim of up to %d events (lease 1 min), timed %d times from the Store's caller, each claim's events released again "+
		"before the next (not timed); median and 90th percentile. Every stream is in the same table, which holds all of them.\n\n", claimBatch, claimRepeats)
	b.WriteString("| stream | events claimed | median | p90 |\n|---|---:|---:|---:|\n")
	for _, m := range results {
		fmt.Fprintf(&b, "| %s | %d | %s | %s |\n", m.sc.name, m.claimed, msf(m.median), msf(m.p90))
	}
	b.WriteString("\n")
	return emit(b.String(), cfg.out)
}

// fillClaimStream enqueues the scenario's events, 1,000 per transaction.
func fillClaimStream(ctx context.Context, db *database, store *outbox.Store, sc claimScenario) error {
	payload := makePayload(0)
	for done := 0; done < sc.events; {
		tx, err := db.begin(ctx)
		if err != nil {
			return err
		}
		for n := 0; n < 1000 && done < sc.events; n++ {
			ev := outbox.Event{Stream: sc.stream, Key: uuid.NewString(), Kind: millpondKind, Payload: payload}
			if sc.keys > 0 {
				ev.OrderingKey = fmt.Sprintf("k%05d", done%sc.keys)
			}
			if _, err := store.Enqueue(ctx, tx.outbox(), ev); err != nil {
				tx.rollback(ctx)
				return err
			}
			done++
		}
		if err := tx.commit(ctx); err != nil {
			return err
		}
	}
	return nil
}

// msf formats a short duration in milliseconds with two decimals.
func msf(d time.Duration) string {
	return fmt.Sprintf("%.2f", float64(d)/float64(time.Millisecond))
}
