package outbox

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/millpond/millpond/internal/sqlcore"
)

// DeadSelector names dead-lettered events of one stream for DiscardDead:
// by id, or the dead letters of one group, either of one kind or all of
// them. Exactly one of IDs, Kind and All must be set; otherwise the error
// wraps ErrInvalidSelector.
type DeadSelector struct {
	// Stream is the events' stream (required).
	Stream string
	// IDs selects dead letters of the stream by id (1-MaxBatch ids, in any
	// group: ids are unique across groups). Group must then be empty.
	IDs []int64
	// Group is the consumer group whose dead letters Kind or All select;
	// "" is the default group.
	Group string
	// Kind selects the group's dead letters of this event kind.
	Kind string
	// All selects every dead letter of the group.
	All bool
}

// Validate checks the selector; errors wrap ErrInvalidSelector,
// ErrInvalidKey, ErrInvalidID or ErrInvalidBatch.
func (s DeadSelector) Validate() error { return sqlcore.DeadSelector(s).Validate() }

// RetireRequest asks RetireGroup to unregister a consumer group from a
// stream.
type RetireRequest struct {
	// Stream is the stream (required).
	Stream string
	// Group is the consumer group (required: the default group "" is not a
	// registration and cannot be retired).
	Group string
	// Discard deletes the group's undelivered events (pending, processing
	// and dead-lettered) instead of refusing while some are pending or
	// processing.
	Discard bool
}

// Retired reports what RetireGroup did or, when it refused, what it found.
type Retired struct {
	// Unregistered is true when the group's registration was removed.
	Unregistered bool
	// Pending, Processing and Dead count the group's undelivered events:
	// the ones deleted with Discard, otherwise the ones found (including
	// when RetireGroup refused with ErrGroupNotDrained; dead letters stay
	// with a group retired without Discard).
	Pending, Processing, Dead int64
}

// MigrateResult reports what a migration run did.
type MigrateResult struct {
	// Applied lists the migrations this run applied, oldest first; empty
	// when the schema was already up to date.
	Applied []Migration
	// Version is the highest migration recorded after the run.
	Version int
}

// GroupRegistration is one consumer group's registration on a stream.
type GroupRegistration struct {
	// Stream is the stream.
	Stream string
	// Group is the consumer group.
	Group string
	// AllKinds is true when the group takes every kind of the stream.
	AllKinds bool
	// Kinds are the kinds the group is registered for, sorted (besides
	// every kind when AllKinds is set).
	Kinds []string
	// RegisteredAt is when the group's oldest registration was written.
	RegisteredAt time.Time
}

// GroupInfo describes one consumer group of one stream: its registration,
// if any, and its rows. A group is listed when it is registered or has rows;
// the default group "" appears when events are waiting in it.
type GroupInfo struct {
	// Stream is the stream.
	Stream string
	// Group is the consumer group; "" is the default group, where events
	// wait that no group took when they were enqueued.
	Group string
	// Registered is true when the group is registered for the stream, so
	// that new events of its kinds are written for it. A group that has rows
	// but is not registered gets no new events.
	Registered bool
	// AllKinds is true when the group is registered for every kind.
	AllKinds bool
	// Kinds are the kinds the group is registered for, sorted.
	Kinds []string
	// RegisteredAt is when the group's oldest registration was written;
	// zero when it is not registered.
	RegisteredAt time.Time
	// Pending counts events waiting for a claim (including delayed retries)
	// and events blocked behind the head of their ordering key (which
	// Stats counts apart, as Blocked).
	Pending int64
	// Processing counts claimed events (some leases may have expired).
	Processing int64
	// Dead counts dead-lettered events.
	Dead int64
	// Delivered counts delivered events that Purge has not removed yet
	// (with WithDeleteOnAck, only those delivered before the option was
	// set: acknowledged rows are deleted).
	Delivered int64
	// LastEnqueuedAt is when the newest event still stored for the group
	// was enqueued; zero when it has no rows.
	LastEnqueuedAt time.Time
	// LastDeliveredAt is when the group last acknowledged an event, among
	// the delivered rows Purge has not removed; zero when there is none.
	// It is the group's last sign of a working consumer: claims and
	// failures leave no timestamp behind. With WithDeleteOnAck it stays
	// zero (or at the last row delivered before the option was set).
	LastDeliveredAt time.Time
}

// Backlog counts the group's undelivered events: pending, processing and
// dead-lettered.
func (g GroupInfo) Backlog() int64 { return g.Pending + g.Processing + g.Dead }

func validateStreams(streams []string) error {
	for _, s := range streams {
		if err := ValidateKey("stream", s); err != nil {
			return err
		}
	}
	return nil
}

// RegisteredGroups lists the consumer groups registered for the given
// streams (none: every stream), by stream and group. It reads only the
// registrations, so it is cheap enough for a start-up check.
func (s *Store) RegisteredGroups(ctx context.Context, streams ...string) ([]GroupRegistration, error) {
	if err := s.ready(ctx); err != nil {
		return nil, err
	}
	if err := validateStreams(streams); err != nil {
		return nil, fmt.Errorf("outbox: registered groups: %w", err)
	}
	subs, err := s.core.Subscriptions(ctx)
	if err != nil {
		return nil, fmt.Errorf("outbox: registered groups: %w", err)
	}
	var out []GroupRegistration
	for _, sub := range subs {
		if len(streams) > 0 && !slices.Contains(streams, sub.Stream) {
			continue
		}
		out = append(out, registration(sub))
	}
	return out, nil
}

func registration(sub sqlcore.Subscription) GroupRegistration {
	r := GroupRegistration{Stream: sub.Stream, Group: sub.Group, RegisteredAt: sub.RegisteredAt}
	for _, k := range sub.Kinds {
		if k == "" {
			r.AllKinds = true
		} else {
			r.Kinds = append(r.Kinds, k)
		}
	}
	slices.Sort(r.Kinds)
	return r
}

// ListGroups describes every consumer group of the given streams (none:
// every stream) that is registered or has rows: its registration, its
// backlog by state and its last activity, by stream and group. It reads the
// whole outbox table; it is meant for operators (millpond groups list), not
// for a hot path.
func (s *Store) ListGroups(ctx context.Context, streams ...string) ([]GroupInfo, error) {
	if err := s.ready(ctx); err != nil {
		return nil, err
	}
	if err := validateStreams(streams); err != nil {
		return nil, fmt.Errorf("outbox: list groups: %w", err)
	}
	subs, err := s.core.Subscriptions(ctx)
	if err != nil {
		return nil, fmt.Errorf("outbox: list groups: %w", err)
	}
	activity, err := s.core.Activity(ctx)
	if err != nil {
		return nil, fmt.Errorf("outbox: list groups: %w", err)
	}
	type key struct{ stream, group string }
	byKey := map[key]*GroupInfo{}
	get := func(stream, group string) *GroupInfo {
		k := key{stream, group}
		if g := byKey[k]; g != nil {
			return g
		}
		g := &GroupInfo{Stream: stream, Group: group}
		byKey[k] = g
		return g
	}
	for _, sub := range subs {
		r := registration(sub)
		g := get(sub.Stream, sub.Group)
		g.Registered, g.AllKinds, g.Kinds, g.RegisteredAt = true, r.AllKinds, r.Kinds, r.RegisteredAt
	}
	for _, a := range activity {
		g := get(a.Stream, a.Group)
		g.Pending, g.Processing, g.Dead, g.Delivered = a.Pending, a.Processing, a.Dead, a.Delivered
		g.LastEnqueuedAt, g.LastDeliveredAt = a.LastEnqueuedAt, a.LastDeliveredAt
	}
	out := make([]GroupInfo, 0, len(byKey))
	for _, g := range byKey {
		if len(streams) > 0 && !slices.Contains(streams, g.Stream) {
			continue
		}
		out = append(out, *g)
	}
	slices.SortFunc(out, func(a, b GroupInfo) int {
		return cmp.Or(strings.Compare(a.Stream, b.Stream), strings.Compare(a.Group, b.Group))
	})
	return out, nil
}

// RetireGroup unregisters a consumer group from a stream, for a handler
// that was renamed or removed: no event is written for the group any more.
//
// Without Discard it refuses while the group has pending or processing
// events, changing nothing: the error wraps ErrGroupNotDrained and Retired
// counts what was found. Let a consumer drain them first, or set Discard,
// which also deletes every undelivered event of the group (pending,
// processing and dead-lettered), in chunks of MaxBatch after the
// registration is gone; a consumer still holding one of them finds its
// claim stale. Without Discard the group's dead letters stay listable
// (ListDead) and can be discarded later (DiscardDead). A group that is
// neither registered nor has anything to discard returns
// ErrGroupNotRegistered. Delivered rows stay until Purge: they keep the
// events' keys in the idempotency window.
//
// On PostgreSQL an enqueueing transaction that read the registration just
// before it was removed may still add an event for the group when it
// commits; ListGroups shows such a row under the unregistered group.
func (s *Store) RetireGroup(ctx context.Context, r RetireRequest) (Retired, error) {
	if err := s.ready(ctx); err != nil {
		return Retired{}, err
	}
	res, err := s.core.RetireGroup(ctx, sqlcore.RetireRequest(r))
	if err != nil {
		return Retired(res), fmt.Errorf("outbox: retire group: %w", err)
	}
	return Retired(res), nil
}

// DiscardDead deletes the dead-lettered events sel names (by id, by kind
// within a group, or all of a group) and returns how many it deleted.
// Events that are not dead letters of the stream are left alone, so a
// result of 0 means nothing matched. A discarded event is gone for good; its
// key leaves the idempotency window unless another group still holds a row
// for it (with WithDeleteOnAck the event, and so its key, stays until
// Purge).
func (s *Store) DiscardDead(ctx context.Context, sel DeadSelector) (int64, error) {
	if err := s.ready(ctx); err != nil {
		return 0, err
	}
	n, err := s.core.DiscardDead(ctx, sqlcore.DeadSelector(sel))
	if err != nil {
		return n, fmt.Errorf("outbox: discard dead letters (%d discarded before the error): %w", n, err)
	}
	return n, nil
}

// CountDead counts the dead-lettered events that DiscardDead would delete
// for sel now, selected by Kind or All (not by IDs: the error then wraps
// ErrInvalidSelector), with plain reads that lock nothing. It is a
// snapshot for a confirmation or a dry run: events dead-lettered meanwhile
// are discarded too.
func (s *Store) CountDead(ctx context.Context, sel DeadSelector) (int64, error) {
	if err := s.ready(ctx); err != nil {
		return 0, err
	}
	n, err := s.core.CountDead(ctx, sqlcore.DeadSelector(sel))
	if err != nil {
		return 0, fmt.Errorf("outbox: count dead letters: %w", err)
	}
	return n, nil
}

// ReroutePending moves the pending events of a stream's default group ""
// (events that no consumer group took when they were enqueued, kept there
// by the bus's UnroutedKeep policy or before any consumer existed) to the
// groups that take their kind now: the groups registered for the stream for
// the event's kind or for every kind, the same choice Reroute makes for
// unrouted dead letters. Each moved event keeps its due time and starts
// with fresh attempts in every such group. Events of kinds no group takes
// stay, and so do events a consumer has claimed. It returns how many events
// it moved; 0 means nothing matched.
//
// A group sees only the events enqueued after it registered; this is the
// explicit exception for the default group's backlog.
func (s *Store) ReroutePending(ctx context.Context, stream string) (int64, error) {
	if err := s.ready(ctx); err != nil {
		return 0, err
	}
	n, err := s.core.ReroutePending(ctx, stream)
	if err != nil {
		return n, fmt.Errorf("outbox: reroute pending events (%d moved before the error): %w", n, err)
	}
	return n, nil
}

// SchemaVersion returns the highest schema migration recorded in the
// database, or 0 when the outbox schema is not installed (run Migrate).
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	if err := s.ready(ctx); err != nil {
		return 0, err
	}
	v, err := s.core.SchemaVersion(ctx)
	if err != nil {
		return 0, fmt.Errorf("outbox: schema version: %w", err)
	}
	return v, nil
}

// MigrateReport is Migrate that also reports which migrations this call
// applied and the schema version afterwards.
func (s *Store) MigrateReport(ctx context.Context) (MigrateResult, error) {
	if err := s.ready(ctx); err != nil {
		return MigrateResult{}, err
	}
	res, err := s.core.MigrateReport(ctx)
	if err != nil {
		return MigrateResult{}, fmt.Errorf("outbox: migrate: %w", err)
	}
	out := MigrateResult{Version: res.Version, Applied: make([]Migration, len(res.Applied))}
	for i, m := range res.Applied {
		out.Applied[i] = Migration(m)
	}
	return out, nil
}
