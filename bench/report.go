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
			cost = fmt.Sprintf("%.2fx", res.baseline/res.enqueueRate)
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

	b.WriteString("\nEnqueue cost = raw INSERT ev/s ÷ system ev/s (higher is more expensive), " +
		"against the raw INSERT baseline measured immediately before that system; ")
	fmt.Fprintf(&b, "the %d baseline measurements ranged %.0f–%.0f ev/s. ", len(r.baselines), lo, hi)
	fmt.Fprintf(&b, "Deliver ratio = system ev/s ÷ %s ev/s (higher is faster). ", refName)
	b.WriteString("Deliver ev/s counts from starting the consumers until the last event was first handled. " +
		"Latency is from the producer's Commit returning to the handler first seeing the event.\n\n")

	b.WriteString("Systems:\n\n")
	for _, res := range r.results {
		fmt.Fprintf(&b, "- **%s** (`%s`): %s.", res.info.label, res.info.name, res.info.notes)
		if res.offeredRate > 0 {
			fmt.Fprintf(&b, " Latency phase achieved %.0f commits/s.", res.offeredRate)
		}
		if res.err != nil {
			fmt.Fprintf(&b, " **Error:** %v.", res.err)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// ms formats a duration in milliseconds.
func ms(d time.Duration) string {
	return fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond))
}
