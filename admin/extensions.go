package admin

import (
	"context"
	"time"

	"github.com/millpond/millpond/outbox"
)

// extensions are the operations the UI takes from the Store beyond Stats,
// ListDead, Requeue, Reroute and FindEvents: a nil function renders "not
// available in this version of millpond" where its data or action would
// be, never a made-up value. storeExtensions wires each one:
//
//   - groups: Store.ListGroups(ctx), each outbox.GroupInfo as a groupInfo.
//   - retireGroup: Store.RetireGroup(ctx, outbox.RetireRequest{Stream,
//     Group, Discard}).
//   - discardDead: Store.DiscardDead(ctx, outbox.DeadSelector{Stream, IDs}).
type extensions struct {
	groups      func(ctx context.Context) ([]groupInfo, error)
	retireGroup func(ctx context.Context, stream, group string, discard bool) (retired, error)
	discardDead func(ctx context.Context, stream string, ids []int64) (int64, error)
}

// storeExtensions returns the extensions the store supports: the group
// lifecycle (list, unregister) and discarding dead letters.
func storeExtensions(s *outbox.Store) extensions {
	return extensions{
		groups: func(ctx context.Context) ([]groupInfo, error) {
			gs, err := s.ListGroups(ctx)
			if err != nil {
				return nil, err
			}
			out := make([]groupInfo, len(gs))
			for i, g := range gs {
				out[i] = groupInfo{Stream: g.Stream, Group: g.Group, Registered: g.Registered, AllKinds: g.AllKinds,
					Kinds: g.Kinds, RegisteredAt: g.RegisteredAt, Pending: g.Pending, Processing: g.Processing,
					Dead: g.Dead, Delivered: g.Delivered, LastEnqueuedAt: g.LastEnqueuedAt, LastDeliveredAt: g.LastDeliveredAt}
			}
			return out, nil
		},
		retireGroup: func(ctx context.Context, stream, group string, discard bool) (retired, error) {
			r, err := s.RetireGroup(ctx, outbox.RetireRequest{Stream: stream, Group: group, Discard: discard})
			return retired(r), err
		},
		discardDead: func(ctx context.Context, stream string, ids []int64) (int64, error) {
			return s.DiscardDead(ctx, outbox.DeadSelector{Stream: stream, IDs: ids})
		},
	}
}

// groupInfo is one consumer group as the groups page shows it when the
// Store can list groups (the fields of outbox.GroupInfo).
type groupInfo struct {
	Stream, Group                        string
	Registered, AllKinds                 bool
	Kinds                                []string
	RegisteredAt                         time.Time
	Pending, Processing, Dead, Delivered int64
	LastEnqueuedAt, LastDeliveredAt      time.Time
}

// retired reports what unregistering a group did (the fields of
// outbox.Retired).
type retired struct {
	Unregistered              bool
	Pending, Processing, Dead int64
}
