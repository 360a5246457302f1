package main

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// report collects a run's measurements and renders them as markdown.
type report struct {
	cfg      config
	env      string
	dialect  string
	started  time.Time
	finished time.Time
	// baselines are the raw INSERT enqueue rates of every slice.
	baselines      []float64
	results        []result
	fanout         []fanoutEnqueue
	fanoutDelivery []fanoutDelivery
}

// summary is one system's figures over its runs in this report: medians,
// with the range of the delivery rates.
type summary struct {
	info          systemInfo
	runs, failed  int
	enqueueRate   float64
	enqueueCost   float64
	costLo        float64
	costHi        float64
	deliver       float64
	deliverLo     float64
	deliverHi     float64
	p50, p95, p99 time.Duration // medians of the runs' percentiles
	latencyRuns   int
	duplicates    int64
	unknown       int64
}

// summaries aggregates the results per system, in order of first run.
func (r report) summaries() []*summary {
	var out []*summary
	by := map[string]*summary{}
	type acc struct{ cost, ratios, rate, deliver, p50, p95, p99 []float64 }
	accs := map[string]*acc{}
	for _, res := range r.results {
		s := by[res.info.name]
		if s == nil {
			s = &summary{info: res.info}
			by[res.info.name] = s
			accs[res.info.name] = &acc{}
			out = append(out, s)
		}
		a := accs[res.info.name]
		s.runs++
		if res.err != nil {
			s.failed++
		}
		s.duplicates += res.duplicates
		s.unknown += res.unknown
		if res.enqueueRate > 0 {
			a.cost = append(a.cost, res.enqueueCost)
			a.ratios = append(a.ratios, res.enqueueRatios...)
			a.rate = append(a.rate, res.enqueueRate)
		}
		if res.deliverRate > 0 {
			a.deliver = append(a.deliver, res.deliverRate)
		}
		if len(res.latencies) > 0 {
			a.p50 = append(a.p50, float64(percentile(res.latencies, 50)))
			a.p95 = append(a.p95, float64(percentile(res.latencies, 95)))
			a.p99 = append(a.p99, float64(percentile(res.latencies, 99)))
		}
	}
	for _, s := range out {
		a := accs[s.info.name]
		s.enqueueCost, s.enqueueRate = median(a.cost), median(a.rate)
		if len(a.ratios) > 0 {
			s.costLo, s.costHi = slices.Min(a.ratios), slices.Max(a.ratios)
		}
		if len(a.deliver) > 0 {
			s.deliverLo, s.deliverHi = slices.Min(a.deliver), slices.Max(a.deliver)
			s.deliver = median(a.deliver)
		}
		s.latencyRuns = len(a.p50)
		s.p50, s.p95, s.p99 = time.Duration(median(a.p50)), time.Duration(median(a.p95)), time.Duration(median(a.p99))
	}
	return out
}

// best returns the summary among those whose name has the prefix with the
// highest median delivery rate.
func best(sums []*summary, prefix string) *summary {
	var b *summary
	for _, s := range sums {
		if strings.HasPrefix(s.info.name, prefix) && s.deliver > 0 && (b == nil || s.deliver > b.deliver) {
			b = s
		}
	}
	return b
}

func find(sums []*summary, name string) *summary {
	for _, s := range sums {
		if s.info.name == name && s.runs > s.failed {
			return s
		}
	}
	return nil
}

// reference is the system delivery and latency are compared against: the
// best river configuration on PostgreSQL, the best watermill-sql one on
// MySQL, the bare Subscriber on SQLite.
func (r report) reference(sums []*summary) *summary {
	switch r.dialect {
	case dialectPostgres:
		return best(sums, "river")
	case dialectMySQL:
		return best(sums, "watermill-sql")
	default:
		return find(sums, "millpond")
	}
}

func (r report) markdown() string {
	var b strings.Builder
	cfg := r.cfg
	fmt.Fprintf(&b, "# millpond benchmark (%s)\n\n", r.dialect)
	fmt.Fprintf(&b, "Run %s, %s. %s.\n\n", r.started.UTC().Format(time.RFC3339), r.finished.Sub(r.started).Round(time.Second), r.env)
	fmt.Fprintf(&b, "Workload: %d producers, each transaction = 1 domain row + 1 event (~%d-byte JSON payload); "+
		"%d events enqueued with no consumers running, then delivered by %d workers; "+
		"latency phase offers %d ev/s for %d s with consumers running. Prefilled delivered rows per system: %d. "+
		"Systems named several times were run several times, interleaved with the others; their figures are the medians of their runs.\n\n",
		cfg.producers, payloadSize, cfg.events, cfg.workers, cfg.rate, cfg.latencySeconds, cfg.prefill)

	sums := r.summaries()
	ref := r.reference(sums)
	refName := "reference"
	if ref != nil {
		refName = "`" + ref.info.name + "`"
	}

	fmt.Fprintf(&b, "| system (configuration) | runs | enqueue cost vs raw INSERT | deliver ev/s | deliver vs %s | p50 / p95 / p99 ms | p50, p99 vs %s | duplicates |\n", refName, refName)
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range sums {
		cost := "–"
		if s.enqueueRate > 0 {
			cost = fmt.Sprintf("%.2fx (%.2f–%.2f)", s.enqueueCost, s.costLo, s.costHi)
		}
		del, delRatio := "–", "–"
		if s.deliver > 0 {
			del = fmt.Sprintf("%.0f", s.deliver)
			if s.deliverLo != s.deliverHi {
				del += fmt.Sprintf(" (%.0f–%.0f)", s.deliverLo, s.deliverHi)
			}
			if ref != nil {
				delRatio = fmt.Sprintf("%.2fx", s.deliver/ref.deliver)
			}
		}
		lat, latRatio := "–", "–"
		if s.latencyRuns > 0 {
			lat = fmt.Sprintf("%s / %s / %s", ms(s.p50), ms(s.p95), ms(s.p99))
			if ref != nil && ref.latencyRuns > 0 && ref.p50 > 0 && ref.p99 > 0 {
				latRatio = fmt.Sprintf("%.2fx, %.2fx", float64(s.p50)/float64(ref.p50), float64(s.p99)/float64(ref.p99))
			}
		}
		dups := fmt.Sprintf("%d", s.duplicates)
		if s.unknown > 0 {
			dups += fmt.Sprintf(" (+%d unparseable)", s.unknown)
		}
		runs := fmt.Sprintf("%d", s.runs)
		if s.failed > 0 {
			runs += fmt.Sprintf(" (%d failed)", s.failed)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", s.info.label, runs, cost, del, delRatio, lat, latRatio, dups)
	}

	lo, hi := 0.0, 0.0
	if len(r.baselines) > 0 {
		lo, hi = slices.Min(r.baselines), slices.Max(r.baselines)
	}
	fmt.Fprintf(&b, "\nEnqueue cost = raw INSERT ev/s ÷ system ev/s (higher is more expensive): each run enqueues its events in %d slices, "+
		"each right after a raw INSERT slice of the same size (the same transaction, the event a plain INSERT into a table with only a primary key); "+
		"the figure is the median of the runs' medians of the per-slice ratios, with the range of all slices in brackets. "+
		"The %d raw INSERT slices ranged %.0f–%.0f ev/s. ", enqueueRounds, len(r.baselines), lo, hi)
	fmt.Fprintf(&b, "Deliver ev/s counts from starting the consumers until the last event was first handled (median, range of the runs). "+
		"Ratios are against %s, measured in this run. "+
		"Latency is from the producer's Commit returning to the handler first seeing the event; its percentiles are medians over the runs.\n\n", refName)

	r.fanoutMarkdown(&b)
	r.targets(&b, sums)

	b.WriteString("Systems:\n\n")
	for _, s := range sums {
		fmt.Fprintf(&b, "- **%s** (`%s`): %s.\n", s.info.label, s.info.name, s.info.notes)
	}
	b.WriteString("\nRuns, in order:\n\n")
	for i, res := range r.results {
		fmt.Fprintf(&b, "%d. `%s`:", i+1, res.info.name)
		if res.enqueueRate > 0 {
			fmt.Fprintf(&b, " enqueue %.2fx;", res.enqueueCost)
		}
		if res.deliverRate > 0 {
			fmt.Fprintf(&b, " deliver %.0f ev/s (first event after %s ms);", res.deliverRate, ms(res.firstHandled))
		}
		if len(res.latencies) > 0 {
			fmt.Fprintf(&b, " p50/p99 %s/%s ms", ms(percentile(res.latencies, 50)), ms(percentile(res.latencies, 99)))
			if len(res.latencies) < res.latencyEvents {
				fmt.Fprintf(&b, " (%d/%d handled)", len(res.latencies), res.latencyEvents)
			}
			b.WriteString(";")
		}
		if res.offeredRate > 0 {
			fmt.Fprintf(&b, " latency phase achieved %.0f commits/s.", res.offeredRate)
		}
		if res.err != nil {
			fmt.Fprintf(&b, " **Error:** %v.", res.err)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// fanoutFor returns the fan-out enqueue figures of a system and group count.
func (r report) fanoutFor(system string, groups int) *fanoutEnqueue {
	for i := range r.fanout {
		if f := &r.fanout[i]; f.system == system && f.groups == groups && f.err == nil {
			return f
		}
	}
	return nil
}

// fanoutSystemNames lists the fan-out systems in order of first appearance.
func (r report) fanoutSystemNames() []string {
	return firstSeen(r.fanout, func(f fanoutEnqueue) string { return f.system })
}

// fanoutDeliveryNames lists the systems of the fan-out delivery runs in
// order of first appearance.
func (r report) fanoutDeliveryNames() []string {
	return firstSeen(r.fanoutDelivery, func(d fanoutDelivery) string { return d.system })
}

// firstSeen lists the distinct names of items in order of first appearance.
func firstSeen[T any](items []T, name func(T) string) []string {
	var names []string
	for _, it := range items {
		if n := name(it); !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	return names
}

// fanoutRate is the median fan-out delivery rate of a system.
func (r report) fanoutRate(system string) (float64, []float64) {
	var rates []float64
	for _, d := range r.fanoutDelivery {
		if d.system == system && d.err == nil {
			rates = append(rates, d.rate)
		}
	}
	return median(slices.Clone(rates)), rates
}

func (r report) fanoutMarkdown(b *strings.Builder) {
	if len(r.fanout) == 0 {
		return
	}
	names := r.fanoutSystemNames()
	fmt.Fprintf(b, "## Fan-out: consumer groups on one stream\n\n%d events of ~%d bytes per measurement, %d producers; "+
		"bytes per event = the system's tables with their indexes (%s) ÷ events; enqueue cost measured as above "+
		"(%d slices, each after a raw INSERT slice).\n\n", r.cfg.fanoutEvents, payloadSize, r.cfg.producers, sizeMethod(r.dialect), enqueueRounds)
	b.WriteString("| groups |")
	for _, n := range names {
		fmt.Fprintf(b, " %s: bytes/event (vs 1 group) | %s: enqueue vs raw INSERT |", n, n)
	}
	b.WriteString("\n|---:|")
	for range names {
		b.WriteString("---:|---:|")
	}
	b.WriteString("\n")
	for _, g := range fanoutGroups {
		fmt.Fprintf(b, "| %d |", g)
		for _, n := range names {
			f, one := r.fanoutFor(n, g), r.fanoutFor(n, 1)
			if f == nil {
				b.WriteString(" error | error |")
				continue
			}
			vs := ""
			if one != nil && one.bytesPerEvent > 0 {
				vs = fmt.Sprintf(" (%.2fx)", f.bytesPerEvent/one.bytesPerEvent)
			}
			fmt.Fprintf(b, " %.0f B%s | %.2fx (%.2f–%.2f) |", f.bytesPerEvent, vs, f.cost, f.ratios[0], f.ratios[len(f.ratios)-1])
		}
		b.WriteString("\n")
	}
	for _, f := range r.fanout {
		if f.err != nil {
			fmt.Fprintf(b, "\n%s with %d groups: **error:** %v.", f.system, f.groups, f.err)
		}
	}
	if len(r.fanoutDelivery) > 0 {
		fmt.Fprintf(b, "\nDelivery with %d consumer groups and %d-byte payloads (%d events, each delivered to every group; deliveries/s = events × groups ÷ time until every group had every event):\n\n",
			fanoutDeliveryGroups, fanoutPayload, r.cfg.fanoutEvents)
		b.WriteString("| system | deliveries/s (median) | runs | vs " + names[len(names)-1] + " |\n|---|---:|---|---:|\n")
		refRate, _ := r.fanoutRate(names[len(names)-1])
		for _, n := range r.fanoutDeliveryNames() {
			rate, runs := r.fanoutRate(n)
			vs := "–"
			if refRate > 0 && rate > 0 {
				vs = fmt.Sprintf("%.2fx", rate/refRate)
			}
			var rs []string
			for _, x := range runs {
				rs = append(rs, fmt.Sprintf("%.0f", x))
			}
			fmt.Fprintf(b, "| %s | %.0f | %s | %s |\n", n, rate, strings.Join(rs, ", "), vs)
		}
		for _, d := range r.fanoutDelivery {
			if d.err != nil {
				fmt.Fprintf(b, "\n%s: **error:** %v.", d.system, d.err)
			}
		}
	}
	b.WriteString("\nmillpond's fan-out: one row per event in millpond_events (its content) and a slim row per event and group in " +
		"millpond_deliveries (its delivery state), each group read by a bare Subscriber " +
		"(batch 1000, -workers in flight; on PostgreSQL the delivery runs also time it with HoldClaims, enqueueing as millpond does). watermill-sql's: its default schema, one row per event and an offset row per " +
		"group, each group read by one Subscriber (batch 1000); its groups cost nothing at enqueue.\n\n")
}

func sizeMethod(dialect string) string {
	switch dialect {
	case dialectPostgres:
		return "pg_total_relation_size"
	case dialectMySQL:
		return "information_schema data_length + index_length after ANALYZE TABLE"
	default:
		return "the pages dbstat counts"
	}
}

// ms formats a duration in milliseconds.
func ms(d time.Duration) string {
	return fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond))
}

// targets checks millpond's figures against the project's targets (issue
// 14), as ratios of systems measured in this run.
func (r report) targets(b *strings.Builder, sums []*summary) {
	check := func(ok bool) string {
		if ok {
			return "met"
		}
		return "**NOT met**"
	}
	var lines []string
	add := func(format string, args ...any) { lines = append(lines, fmt.Sprintf(format, args...)) }
	mp, bus := find(sums, "millpond"), find(sums, "millpond-bus")
	// The held-claim variants (PostgreSQL, extra systems) when they ran.
	systems := []*summary{mp, bus, find(sums, "millpond-held"), find(sums, "millpond-held-delete"), find(sums, "millpond-bus-held")}

	switch r.dialect {
	case dialectPostgres:
		river, wm := best(sums, "river"), best(sums, "watermill-sql")
		for _, s := range systems {
			if s == nil || s.deliver == 0 {
				continue
			}
			if river != nil {
				x := s.deliver / river.deliver
				add("`%s` delivery ≥ 2× the best river configuration (`%s`): %.2fx, %s", s.info.name, river.info.name, x, check(x >= 2))
			}
			if wm != nil {
				x := s.deliver / wm.deliver
				add("`%s` delivery ≥ 2× the best watermill-sql configuration (`%s`): %.2fx, %s", s.info.name, wm.info.name, x, check(x >= 2))
			}
		}
		for _, s := range systems {
			if s == nil || s.latencyRuns == 0 || river == nil || river.latencyRuns == 0 {
				continue
			}
			add("`%s` commit→handler p50 and p99 no worse than `%s`: %s / %s ms against %s / %s ms, %s",
				s.info.name, river.info.name, ms(s.p50), ms(s.p99), ms(river.p50), ms(river.p99),
				check(s.p50 <= river.p50 && s.p99 <= river.p99))
		}
	case dialectMySQL:
		wm := best(sums, "watermill-sql")
		for _, s := range systems {
			if s == nil || wm == nil {
				continue
			}
			if s.enqueueRate > 0 && wm.enqueueRate > 0 {
				add("`%s` enqueue cost ≤ watermill-sql's (`%s`): %.2fx against %.2fx raw INSERT, %s",
					s.info.name, wm.info.name, s.enqueueCost, wm.enqueueCost, check(s.enqueueCost <= wm.enqueueCost))
			}
			if s.deliver > 0 {
				x := s.deliver / wm.deliver
				add("`%s` delivery ≥ watermill-sql's (`%s`): %.2fx, %s", s.info.name, wm.info.name, x, check(x >= 1))
			}
			if s.latencyRuns > 0 && wm.latencyRuns > 0 {
				add("`%s` p50 ≤ watermill-sql's (`%s`): %s against %s ms, %s", s.info.name, wm.info.name, ms(s.p50), ms(wm.p50), check(s.p50 <= wm.p50))
			}
		}
	case dialectSQLite:
		if mp != nil && bus != nil && mp.deliver > 0 && bus.deliver > 0 {
			x := bus.deliver / mp.deliver
			add("bus with a typed handler (`millpond-bus`) ≥ 0.9× the bare Subscriber (`millpond`): %.2fx, %s", x, check(x >= 0.9))
		}
		bd, md := find(sums, "millpond-bus-default"), find(sums, "millpond-default")
		if bd != nil && md != nil && bd.deliver > 0 && md.deliver > 0 {
			add("(defaults, for information) `millpond-bus-default` against `millpond-default`: %.2fx", bd.deliver/md.deliver)
		}
		if mp != nil && mp.enqueueRate > 0 {
			add("`millpond` enqueue ≤ 1.5× a raw INSERT: %.2fx, %s", mp.enqueueCost, check(mp.enqueueCost <= 1.5))
		}
	}
	if mp != nil && mp.enqueueRate > 0 && r.dialect != dialectSQLite {
		add("`millpond` enqueue ≤ 1.3× a raw INSERT with one group (main run, default group): %.2fx, %s", mp.enqueueCost, check(mp.enqueueCost <= 1.3))
	}
	one, eight := r.fanoutFor("millpond", 1), r.fanoutFor("millpond", 8)
	if one != nil {
		add("fan-out: enqueue ≤ 1.3× a raw INSERT with one group: %.2fx, %s", one.cost, check(one.cost <= 1.3))
	}
	if eight != nil {
		add("fan-out: enqueue ≤ 1.5× a raw INSERT with eight groups: %.2fx, %s", eight.cost, check(eight.cost <= 1.5))
	}
	if one != nil && eight != nil {
		x := eight.bytesPerEvent / one.bytesPerEvent
		add("fan-out: bytes per event with eight groups ≤ 2.5× one group: %.0f B against %.0f B = %.2fx, %s",
			eight.bytesPerEvent, one.bytesPerEvent, x, check(x <= 2.5))
	}
	if names := r.fanoutSystemNames(); len(names) > 1 {
		mpRate, _ := r.fanoutRate("millpond")
		wmRate, _ := r.fanoutRate(names[len(names)-1])
		if mpRate > 0 && wmRate > 0 {
			add("(for information) delivery with %d groups and %d-byte payloads against watermill-sql: %.2fx", fanoutDeliveryGroups, fanoutPayload, mpRate/wmRate)
		}
	}
	lines = append(lines, r.orderingTargets(sums, check)...)
	if len(lines) == 0 {
		return
	}
	fmt.Fprintf(b, "## Targets (issues 14 and 11), ratios within this run\n\n")
	for _, l := range lines {
		fmt.Fprintf(b, "- %s\n", l)
	}
	b.WriteString("\n")
}

// orderingTargets compares the ordered systems with the bare Subscriber of
// the same run (issue 11): delivery over 1,000 keys ≥ 0.7×, over 10 keys
// reported; enqueue with an ordering key ≤ 1.15× enqueue without (the
// ratio of the two enqueue costs against the raw INSERT).
func (r report) orderingTargets(sums []*summary, check func(bool) string) []string {
	mp := find(sums, "millpond")
	if mp == nil {
		return nil
	}
	var lines []string
	for _, name := range []string{"millpond-ordered-1000", "millpond-ordered-10"} {
		o := find(sums, name)
		if o == nil {
			continue
		}
		if o.deliver > 0 && mp.deliver > 0 {
			x := o.deliver / mp.deliver
			if name == "millpond-ordered-1000" {
				lines = append(lines, fmt.Sprintf("`%s` delivery ≥ 0.7× unordered (`millpond`): %.2fx (%.0f against %.0f ev/s), %s", name, x, o.deliver, mp.deliver, check(x >= 0.7)))
			} else {
				lines = append(lines, fmt.Sprintf("(for information) `%s` delivery against unordered (`millpond`): %.2fx (%.0f against %.0f ev/s)", name, x, o.deliver, mp.deliver))
			}
		}
		if o.enqueueRate > 0 && mp.enqueueRate > 0 {
			x := o.enqueueCost / mp.enqueueCost
			lines = append(lines, fmt.Sprintf("`%s` enqueue ≤ 1.15× enqueue without an ordering key: %.2fx raw INSERT against %.2fx = %.2fx, %s", name, o.enqueueCost, mp.enqueueCost, x, check(x <= 1.15)))
		}
	}
	return lines
}
