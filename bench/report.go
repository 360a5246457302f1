package main

import (
	"fmt"
	"strings"
	"time"
)

// report collects a run's measurements and renders them as markdown.
type report struct {
	cfg     config
	env     string
	started time.Time
	// baselines are the raw INSERT enqueue rates, one measured before each
	// system and one after the last.
	baselines []float64
	results   []result
}

// referenceDeliverers are the systems delivery rates are compared against,
// in order of preference.
var referenceDeliverers = []string{"river", "river-default"}

func (r report) markdown() string {
	var b strings.Builder
	cfg := r.cfg
	fmt.Fprintf(&b, "# millpond benchmark\n\n")
	fmt.Fprintf(&b, "Run %s. %s.\n\n", r.started.UTC().Format(time.RFC3339), r.env)
	fmt.Fprintf(&b, "Workload: %d producers, each transaction = 1 domain row + 1 event (~%d-byte JSON payload); "+
		"%d events enqueued with no consumers running, then delivered by %d workers; "+
		"latency phase offers %d ev/s for %d s with consumers running. Prefilled delivered rows per system: %d.\n\n",
		cfg.producers, payloadSize, cfg.events, cfg.workers, cfg.rate, cfg.latencySeconds, cfg.prefill)

	var sum, lo, hi float64
	for i, v := range r.baselines {
		sum += v
		if i == 0 || v < lo {
			lo = v
		}
		hi = max(hi, v)
	}
	mean := sum / float64(len(r.baselines))
	var ref *result
	for _, name := range referenceDeliverers {
		for i := range r.results {
			if r.results[i].info.name == name && r.results[i].deliverRate > 0 && ref == nil {
				ref = &r.results[i]
			}
		}
	}
	refName := "river"
	if ref != nil {
		refName = ref.info.label
	}

	fmt.Fprintf(&b, "| system | enqueue ev/s | enqueue cost vs raw INSERT | deliver ev/s | deliver vs %s | p50/p95/p99 ms | duplicates |\n", refName)
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|\n")
	fmt.Fprintf(&b, "| raw INSERT (baseline, mean of %d) | %.0f | 1.00x | – | – | – | – |\n", len(r.baselines), mean)
	for _, res := range r.results {
		enq, cost := "–", "–"
		if res.enqueueRate > 0 {
			enq = fmt.Sprintf("%.0f", res.enqueueRate)
			cost = fmt.Sprintf("%.2fx", res.enqueueCost)
			if n := len(res.enqueueRatios); n > 1 {
				cost += fmt.Sprintf(" (%.2f–%.2f)", res.enqueueRatios[0], res.enqueueRatios[n-1])
			}
		}
		del, delRatio := "–", "–"
		switch {
		case res.deliverRate > 0:
			del = fmt.Sprintf("%.0f", res.deliverRate)
			if ref != nil {
				delRatio = fmt.Sprintf("%.2fx", res.deliverRate/ref.deliverRate)
			}
		case res.enqueueRate > 0 && !res.deliverDone:
			del = fmt.Sprintf("timeout (%d/%d)", res.delivered, cfg.events)
		}
		lat := "–"
		if len(res.latencies) > 0 {
			lat = fmt.Sprintf("%s / %s / %s", ms(percentile(res.latencies, 50)),
				ms(percentile(res.latencies, 95)), ms(percentile(res.latencies, 99)))
			if len(res.latencies) < res.latencyEvents {
				lat += fmt.Sprintf(" (%d/%d handled)", len(res.latencies), res.latencyEvents)
			}
		}
		dups := fmt.Sprintf("%d", res.duplicates)
		if res.unknown > 0 {
			dups += fmt.Sprintf(" (+%d unparseable)", res.unknown)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n", res.info.label, enq, cost, del, delRatio, lat, dups)
	}

	fmt.Fprintf(&b, "\nEnqueue cost = raw INSERT ev/s ÷ system ev/s (higher is more expensive): each system's events are "+
		"enqueued in %d slices, each right after a raw INSERT slice of the same size; the figure is the median of the "+
		"per-slice ratios, with their range in brackets. ", enqueueRounds)
	fmt.Fprintf(&b, "The %d raw INSERT slices ranged %.0f–%.0f ev/s. ", len(r.baselines), lo, hi)
	fmt.Fprintf(&b, "Deliver ratio = system ev/s ÷ %s ev/s (higher is faster). ", refName)
	b.WriteString("Deliver ev/s counts from starting the consumers until the last event was first handled. " +
		"Latency is from the producer's Commit returning to the handler first seeing the event.\n\n")

	r.targets(&b)

	b.WriteString("Systems:\n\n")
	described := map[string]bool{}
	for _, res := range r.results {
		if !described[res.info.name] {
			described[res.info.name] = true
			fmt.Fprintf(&b, "- **%s** (`%s`): %s.\n", res.info.label, res.info.name, res.info.notes)
		}
	}
	b.WriteString("\nRuns:\n\n")
	for i, res := range r.results {
		fmt.Fprintf(&b, "%d. `%s`:", i+1, res.info.name)
		if res.offeredRate > 0 {
			fmt.Fprintf(&b, " latency phase achieved %.0f commits/s.", res.offeredRate)
		}
		if res.err != nil {
			fmt.Fprintf(&b, " **Error:** %v.", res.err)
		}
		if res.offeredRate <= 0 && res.err == nil {
			b.WriteString(" ok.")
		}
		b.WriteString("\n")
	}
	return b.String()
}

// ms formats a duration in milliseconds.
func ms(d time.Duration) string {
	return fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond))
}

// targets checks millpond's figures against the project's targets, as
// ratios of systems measured in this run.
func (r report) targets(b *strings.Builder) {
	// A system listed several times in -systems is measured several times;
	// its figures here are the medians of its runs.
	get := func(name string) *result {
		var runs []result
		for _, res := range r.results {
			if res.info.name == name && res.err == nil {
				runs = append(runs, res)
			}
		}
		if len(runs) == 0 {
			return nil
		}
		agg := runs[0]
		var deliver, cost []float64
		for _, res := range runs {
			deliver = append(deliver, res.deliverRate)
			cost = append(cost, res.enqueueCost)
		}
		agg.deliverRate, agg.enqueueCost = median(deliver), median(cost)
		return &agg
	}
	mp := get("millpond")
	if mp == nil {
		return
	}
	check := func(ok bool) string {
		if ok {
			return "met"
		}
		return "**not met**"
	}
	b.WriteString("Targets (millpond, ratios within this run; medians where a system ran more than once):\n\n")
	if river := get("river"); river != nil && river.deliverRate > 0 {
		x := mp.deliverRate / river.deliverRate
		fmt.Fprintf(b, "- delivery ≥ 1.5× river (FetchCooldown 1ms): %.2fx, %s\n", x, check(x >= 1.5))
	}
	if wm := get("watermill-sql"); wm != nil && wm.deliverRate > 0 {
		x := mp.deliverRate / wm.deliverRate
		fmt.Fprintf(b, "- delivery ≥ 3× watermill-sql: %.2fx, %s\n", x, check(x >= 3))
	}
	if mp.enqueueRate > 0 {
		x := mp.enqueueCost
		fmt.Fprintf(b, "- enqueue cost ≤ 1.25× raw INSERT: %.2fx, %s\n", x, check(x <= 1.25))
	}
	if len(mp.latencies) > 0 {
		p50, p99 := percentile(mp.latencies, 50), percentile(mp.latencies, 99)
		fmt.Fprintf(b, "- commit→handler p50 < 5 ms and p99 < 50 ms: %s / %s ms, %s\n", ms(p50), ms(p99),
			check(p50 < 5*time.Millisecond && p99 < 50*time.Millisecond))
	}
	if big := get("millpond-1m"); big != nil && big.deliverRate > 0 {
		x := big.deliverRate / mp.deliverRate
		fmt.Fprintf(b, "- delivery with 1,000,000 delivered rows within 10%% of an empty table: %.2fx, %s\n", x, check(x >= 0.9))
	}
	b.WriteString("\n")
}
