package main

import (
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/millpond/millpond/outbox"
)

const groupsListUsage = `Usage: millpond groups list [-stream S] [-json] [-db URL]

List the consumer groups that are registered or hold events, per stream: whether the
group is registered (new events of its kinds are written for it) and for which kinds,
its backlog by state, and its last activity. A group that no running handler serves
(a renamed or removed one) keeps a backlog and no new deliveries; retire it with
"millpond groups unregister". The default group, where events wait that no group
took, shows as (default). This reads the whole outbox table.

With -json, a JSON array with one object per stream and group:
  stream              the stream
  group               the consumer group ("" is the default group)
  registered          true when new events of its kinds are written for it
  all_kinds           true when it is registered for every kind
  kinds               the kinds it is registered for (array, may be empty)
  registered_at       when it registered, RFC 3339 in UTC, or null
  pending             events waiting for a claim, including delayed retries and events
                      blocked behind their ordering key's head (stats shows those apart)
  processing          claimed events
  dead                dead-lettered events
  delivered           delivered events not purged yet
  last_enqueued_at    when its newest stored event was enqueued, or null
  last_delivered_at   when it last acknowledged an event (among rows not purged), or null
`

// groupJSON is one row of "groups list -json"; the field names are stable.
type groupJSON struct {
	Stream          string   `json:"stream"`
	Group           string   `json:"group"`
	Registered      bool     `json:"registered"`
	AllKinds        bool     `json:"all_kinds"`
	Kinds           []string `json:"kinds"`
	RegisteredAt    *string  `json:"registered_at"`
	Pending         int64    `json:"pending"`
	Processing      int64    `json:"processing"`
	Dead            int64    `json:"dead"`
	Delivered       int64    `json:"delivered"`
	LastEnqueuedAt  *string  `json:"last_enqueued_at"`
	LastDeliveredAt *string  `json:"last_delivered_at"`
}

func cmdGroupsList(e *env, args []string) error {
	fs := newFlagSet(e, "groups list", groupsListUsage)
	stream := fs.String("stream", "", "list only this stream's groups")
	asJSON := fs.Bool("json", false, "print JSON (fields above)")
	dbFlag := addDBFlag(fs)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("groups list: unexpected argument %q", pos[0])
	}
	var streams []string
	if *stream != "" {
		if err := validateNames("groups list", *stream, ""); err != nil {
			return err
		}
		streams = append(streams, *stream)
	}
	s, db, err := openInstalled(e, *dbFlag)
	if err != nil {
		return err
	}
	defer s.Close()
	groups, err := s.ListGroups(e.ctx, streams...)
	if err != nil {
		return db.fail("list groups in", err)
	}
	if *asJSON {
		out := make([]groupJSON, len(groups))
		for i, g := range groups {
			out[i] = groupJSON{Stream: g.Stream, Group: g.Group, Registered: g.Registered, AllKinds: g.AllKinds,
				Kinds: append([]string{}, g.Kinds...), RegisteredAt: jsonTime(g.RegisteredAt),
				Pending: g.Pending, Processing: g.Processing, Dead: g.Dead, Delivered: g.Delivered,
				LastEnqueuedAt: jsonTime(g.LastEnqueuedAt), LastDeliveredAt: jsonTime(g.LastDeliveredAt)}
		}
		return writeJSON(e.stdout, out)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STREAM\tGROUP\tREGISTERED\tKINDS\tPENDING\tPROCESSING\tDEAD\tDELIVERED\tLAST_ENQUEUED\tLAST_DELIVERED")
	for _, g := range groups {
		registered, kinds := "no", "-"
		if g.Registered {
			registered, kinds = "yes", strings.Join(g.Kinds, ",")
			if g.AllKinds {
				kinds = "*"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\n", g.Stream, groupName(g.Group), registered, kinds,
			g.Pending, g.Processing, g.Dead, g.Delivered, textTime(g.LastEnqueuedAt), textTime(g.LastDeliveredAt))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write groups: %w", err)
	}
	if len(groups) == 0 {
		fmt.Fprintln(e.stderr, "no consumer group is registered or holds events")
	}
	return nil
}

const groupsUnregisterUsage = `Usage: millpond groups unregister -stream S -group G [-discard [-yes | -dry-run]] [-db URL]

Retire a consumer group, typically of a renamed or removed handler: remove its
registration so that no event is written for it any more. Refused (exit 1) while the
group has pending or processing events, which would never be delivered: let a
consumer drain them first, or add -discard to delete the group's undelivered events
(pending, processing and dead-lettered) for good. Without -discard its dead letters
stay listable. Delivered rows stay until purge. Exits 3 when the group is not
registered and has nothing to discard.

With -discard it deletes only when confirmed: -yes deletes at once (for scripts);
without it, it prints how many events of the group it would delete and asks, on a
terminal, for the group's name. Otherwise nothing is changed and it exits 2.
-dry-run only prints the counts.
`

func cmdGroupsUnregister(e *env, args []string) error {
	fs := newFlagSet(e, "groups unregister", groupsUnregisterUsage)
	stream := fs.String("stream", "", "stream of the group (required)")
	group := fs.String("group", "", "consumer group to retire (required)")
	discard := fs.Bool("discard", false, "also delete the group's pending, processing and dead-lettered events")
	bulk := addBulkFlags(fs, "unregister -discard")
	dbFlag := addDBFlag(fs)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if err := bulk.check("groups unregister"); err != nil {
		return err
	}
	switch {
	case len(pos) > 0:
		return usagef("groups unregister: unexpected argument %q", pos[0])
	case (bulk.yes || bulk.dryRun) && !*discard:
		return usagef("groups unregister: -yes and -dry-run go with -discard")
	case *stream == "":
		return usagef("groups unregister: -stream is required")
	case *group == "":
		return usagef("groups unregister: -group is required (the default group is not a registration)")
	}
	if err := validateNames("groups unregister", *stream, *group); err != nil {
		return err
	}
	s, db, err := openInstalled(e, *dbFlag)
	if err != nil {
		return err
	}
	defer s.Close()
	if *discard && !bulk.yes {
		// Count and confirm first (-yes skips the count, which reads the
		// stream's whole backlog).
		groups, err := s.ListGroups(e.ctx, *stream)
		if err != nil {
			return db.fail("list groups in", err)
		}
		var g outbox.GroupInfo
		for _, gi := range groups {
			if gi.Group == *group {
				g = gi
			}
		}
		if n := g.Pending + g.Processing + g.Dead; n > 0 {
			if err := confirmBulk(e, bulk, "groups unregister", "changed", *group, fmt.Sprintf("these %d events", n),
				fmt.Sprintf("would unregister group %s from stream %s and discard its %d pending, %d processing and %d dead-lettered events"+
					" (as of now: events written for the group until it is unregistered go too)",
					*group, *stream, g.Pending, g.Processing, g.Dead)); err != nil {
				return err
			}
		} else if bulk.dryRun {
			if !g.Registered {
				return nothingf("groups unregister: group %s is not registered for stream %s and has no undelivered events", *group, *stream)
			}
			return confirmBulk(e, bulk, "groups unregister", "changed", *group, "",
				fmt.Sprintf("group %s of stream %s has no undelivered events to discard (registered: %t)", *group, *stream, g.Registered))
		}
	}
	res, err := s.RetireGroup(e.ctx, outbox.RetireRequest{Stream: *stream, Group: *group, Discard: *discard})
	switch {
	case errors.Is(err, outbox.ErrGroupNotDrained):
		also := ""
		if res.Dead > 0 {
			also = fmt.Sprintf(" (and its %d dead letters)", res.Dead)
		}
		return fmt.Errorf("groups unregister: group %s of stream %s still has %d pending and %d processing events; "+
			"let its consumer drain them, or add -discard to delete them%s; nothing was changed",
			*group, *stream, res.Pending, res.Processing, also)
	case errors.Is(err, outbox.ErrGroupNotRegistered):
		return nothingf("groups unregister: group %s is not registered for stream %s and has no undelivered events", *group, *stream)
	case err != nil:
		return db.fail(fmt.Sprintf("unregister group %s of stream %s in", *group, *stream), err)
	}
	what := fmt.Sprintf("unregistered group %s from stream %s", *group, *stream)
	if !res.Unregistered {
		what = fmt.Sprintf("group %s was not registered for stream %s", *group, *stream)
	}
	if *discard {
		fmt.Fprintf(e.stdout, "%s; discarded %d pending, %d processing and %d dead-lettered events\n", what, res.Pending, res.Processing, res.Dead)
		return nil
	}
	fmt.Fprintln(e.stdout, what)
	if res.Dead > 0 {
		fmt.Fprintf(e.stderr, "its %d dead-lettered events stay: list them with \"millpond dead list -stream %s -group %s\", "+
			"delete them with \"millpond dead discard -stream %s -group %s -all\"\n", res.Dead, *stream, *group, *stream, *group)
	}
	return nil
}

const deadDiscardUsage = `Usage: millpond dead discard -stream S ID... [-db URL]
       millpond dead discard -stream S [-group G] -kind K [-yes | -dry-run] [-db URL]
       millpond dead discard -stream S [-group G] -all [-yes | -dry-run] [-db URL]

Delete dead-lettered events for good: by id (in any group of the stream), or the
dead letters of one consumer group (default: the default group) of one kind or all
of them. Events that are not dead letters are left alone. Exits 3 when nothing
matched.

With -kind or -all it deletes only when confirmed: -yes deletes at once (for
scripts); without it, it prints how many dead letters match and asks, on a terminal,
for the group's name (the stream's for the default group), then discards only those
(not the ones dead-lettered meanwhile). Otherwise nothing is deleted and it exits 2.
-dry-run only prints the count.
`

func cmdDeadDiscard(e *env, args []string) error {
	fs := newFlagSet(e, "dead discard", deadDiscardUsage)
	stream := fs.String("stream", "", "stream of the events (required)")
	group := fs.String("group", "", "consumer group, with -kind or -all (default: the default group)")
	kind := fs.String("kind", "", "discard the group's dead letters of this kind")
	all := fs.Bool("all", false, "discard every dead letter of the group")
	bulk := addBulkFlags(fs, "discard the dead letters -kind or -all selects")
	dbFlag := addDBFlag(fs)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if err := bulk.check("dead discard"); err != nil {
		return err
	}
	given := 0
	for _, b := range []bool{len(pos) > 0, *kind != "", *all} {
		if b {
			given++
		}
	}
	groupSet := false
	fs.Visit(func(f *flag.Flag) { groupSet = groupSet || f.Name == "group" })
	switch {
	case *stream == "":
		return usagef("dead discard: -stream is required")
	case given != 1:
		return usagef("dead discard: give event ids, -kind K or -all (exactly one)")
	case len(pos) > 0 && groupSet:
		return usagef("dead discard: -group goes with -kind or -all; ids select events of every group")
	case len(pos) > 0 && (bulk.yes || bulk.dryRun):
		return usagef("dead discard: -yes and -dry-run go with -kind or -all; ids name each event to delete")
	}
	var ids []int64
	if len(pos) > 0 {
		if ids, err = parseIDs("dead discard", pos); err != nil {
			return err
		}
	}
	if err := validateNames("dead discard", *stream, *group); err != nil {
		return err
	}
	sel := outbox.DeadSelector{Stream: *stream, Group: *group, Kind: *kind, All: *all}
	if err := sel.Validate(); err != nil && len(ids) == 0 {
		return usagef("dead discard: %v", err)
	}
	s, db, err := openInstalled(e, *dbFlag)
	if err != nil {
		return err
	}
	defer s.Close()
	var total int64
	discard := func(sel outbox.DeadSelector) error {
		n, err := s.DiscardDead(e.ctx, sel)
		total += n
		if err != nil {
			if errors.Is(err, outbox.ErrInvalidKey) {
				return usagef("dead discard: %v", err)
			}
			return db.fail(fmt.Sprintf("discard (%d discarded before the error) in", total), err)
		}
		return nil
	}
	if len(ids) > 0 {
		for start := 0; start < len(ids); start += outbox.MaxBatch {
			if err := discard(outbox.DeadSelector{Stream: *stream, IDs: ids[start:min(start+outbox.MaxBatch, len(ids))]}); err != nil {
				return err
			}
		}
		fmt.Fprintf(e.stdout, "discarded %d of %d events\n", total, len(ids))
		if total == 0 {
			return nothingf("dead discard: none of the ids is a dead-lettered event of stream %s", *stream)
		}
		if total < int64(len(ids)) {
			fmt.Fprintf(e.stderr, "%d ids were not dead-lettered events of stream %s, and were left alone\n", int64(len(ids))-total, *stream)
		}
		return nil
	}
	ofKind := "any kind"
	if *kind != "" {
		ofKind = "kind " + *kind
	}
	none := func() error {
		fmt.Fprintln(e.stdout, "discarded 0 dead-lettered events")
		return nothingf("dead discard: group %s of stream %s has no dead letters of %s%s", groupName(*group), *stream, ofKind,
			whereDeadLettersAre(e, s, *stream, *group, *kind))
	}
	if bulk.yes {
		// No count first: a script's run costs and prints what it did
		// before.
		if err := discard(sel); err != nil {
			return err
		}
		if total == 0 {
			return none()
		}
		fmt.Fprintf(e.stdout, "discarded %d dead-lettered events\n", total)
		return nil
	}
	// Count and confirm first. The prompt confirms the dead letters it
	// counted: their ids are read before it and only they are discarded,
	// so an event dead-lettered while the operator reads the prompt (or
	// answers it minutes later) waits for the next discard.
	var n int64
	var confirmed []int64
	if bulk.dryRun {
		if n, err = s.CountDead(e.ctx, sel); err != nil {
			return db.fail("count dead letters in", err)
		}
	} else {
		if confirmed, err = deadIDs(e, s, *stream, *group, *kind); err != nil {
			return db.fail("count dead letters in", err)
		}
		n = int64(len(confirmed))
	}
	if n == 0 {
		return none()
	}
	answer := *group
	if answer == "" {
		answer = *stream
	}
	if err := confirmBulk(e, bulk, "dead discard", "discarded", answer, fmt.Sprintf("these %d dead-lettered events", n),
		fmt.Sprintf("would discard %d dead-lettered events of %s in group %s of stream %s", n, ofKind, groupName(*group), *stream)); err != nil {
		return err
	}
	for start := 0; start < len(confirmed); start += outbox.MaxBatch {
		if err := discard(outbox.DeadSelector{Stream: *stream, IDs: confirmed[start:min(start+outbox.MaxBatch, len(confirmed))]}); err != nil {
			return err
		}
	}
	if total == 0 {
		return none()
	}
	fmt.Fprintf(e.stdout, "discarded %d dead-lettered events\n", total)
	if total < n {
		fmt.Fprintf(e.stderr, "%d of the %d confirmed were no longer dead letters (requeued or discarded meanwhile)\n", n-total, n)
	}
	return nil
}

// deadIDs reads the ids of the dead letters of a group (of one kind, or
// all), page by page, in id order: what a confirmed discard deletes.
func deadIDs(e *env, s *outbox.Store, stream, group, kind string) ([]int64, error) {
	var ids []int64
	q := outbox.DeadQuery{Stream: stream, Group: group, Limit: outbox.MaxBatch}
	for {
		page, err := s.ListDead(e.ctx, q)
		if err != nil {
			return nil, err
		}
		for _, d := range page {
			if kind == "" || d.Kind == kind {
				ids = append(ids, d.ID)
			}
		}
		if len(page) < q.Limit {
			return ids, nil
		}
		q.AfterID = page[len(page)-1].ID
	}
}

// whereDeadLettersAre says, for a discard that matched nothing (a typo in
// the group or kind?), which kinds the group's dead letters have, or which
// groups of the stream hold dead letters; "" when it cannot tell.
func whereDeadLettersAre(e *env, s *outbox.Store, stream, group, kind string) string {
	stats, err := s.Stats(e.ctx)
	if err != nil {
		return ""
	}
	var holders []string
	var inGroup int64
	for _, st := range stats {
		if st.Stream != stream || st.Dead == 0 {
			continue
		}
		if st.Group == group {
			inGroup = st.Dead
		}
		holders = append(holders, fmt.Sprintf("%s (%d)", groupName(st.Group), st.Dead))
	}
	if inGroup == 0 {
		if len(holders) == 0 {
			return "; stream " + stream + " has no dead letters in any group"
		}
		return "; groups of stream " + stream + " with dead letters: " + strings.Join(holders, ", ")
	}
	if kind == "" {
		return ""
	}
	// The kinds among the group's oldest dead letters (one page).
	dead, err := s.ListDead(e.ctx, outbox.DeadQuery{Stream: stream, Group: group, Limit: outbox.MaxBatch})
	if err != nil || len(dead) == 0 {
		return ""
	}
	seen := map[string]bool{}
	var kinds []string
	for _, d := range dead {
		if !seen[d.Kind] {
			seen[d.Kind] = true
			kinds = append(kinds, d.Kind)
		}
	}
	slices.Sort(kinds)
	more := ""
	if int64(len(dead)) < inGroup {
		more = fmt.Sprintf(" (among its oldest %d)", len(dead))
	}
	return fmt.Sprintf("; its %d dead letters are of kinds%s: %s", inGroup, more, strings.Join(kinds, ", "))
}

const pendingRerouteUsage = `Usage: millpond pending reroute -stream S [-db URL]

Move the pending events of a stream's default group (events that no consumer group
took when they were enqueued, kept there before any consumer existed or by the bus's
UnroutedKeep policy) to the groups that take their kind now: the groups registered
for the stream for the event's kind or for every kind, as "dead reroute" chooses
them. Each moved event keeps its due time and starts with fresh attempts. Events of
kinds no group takes, and claimed ones, stay. Exits 3 when nothing moved.
`

func cmdPendingReroute(e *env, args []string) error {
	fs := newFlagSet(e, "pending reroute", pendingRerouteUsage)
	stream := fs.String("stream", "", "stream of the events (required)")
	dbFlag := addDBFlag(fs)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(pos) > 0:
		return usagef("pending reroute: unexpected argument %q", pos[0])
	case *stream == "":
		return usagef("pending reroute: -stream is required")
	}
	if err := validateNames("pending reroute", *stream, ""); err != nil {
		return err
	}
	s, db, err := openInstalled(e, *dbFlag)
	if err != nil {
		return err
	}
	defer s.Close()
	n, err := s.ReroutePending(e.ctx, *stream)
	if err != nil {
		return db.fail(fmt.Sprintf("reroute pending events (%d moved before the error) in", n), err)
	}
	fmt.Fprintf(e.stdout, "moved %d pending events of the default group of stream %s\n", n, *stream)
	if n == 0 {
		return nothingf("pending reroute: no pending event of the default group of stream %s has a kind that a group takes now", *stream)
	}
	return nil
}
