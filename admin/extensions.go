package admin

import (
	"context"
	"time"

	"github.com/millpond/millpond/outbox"
)

// extensions are the operations this version of the outbox Store does not
// have yet: a nil function renders "not available in this version of
// millpond" where its data or action would be, never a made-up value.
// storeExtensions wires each one to its Store method once that exists:
//
//   - groups: Store.ListGroups(ctx) (the group lifecycle), converting each
//     outbox.GroupInfo into a groupInfo field by field.
//   - retireGroup: Store.RetireGroup(ctx, outbox.RetireRequest{Stream,
//     Group, Discard}), converting outbox.Retired into retired.
//   - discardDead: Store.DiscardDead(ctx, outbox.DeadSelector{Stream, IDs}).
//   - blockedKeys: the per-key ordering's blocked-key counts per stream and
//     group (a field of Store.Stats or its own method).
type extensions struct {
	groups      func(ctx context.Context) ([]groupInfo, error)
	retireGroup func(ctx context.Context, stream, group string, discard bool) (retired, error)
	discardDead func(ctx context.Context, stream string, ids []int64) (int64, error)
	blockedKeys func(ctx context.Context) (map[streamGroup]int64, error)
}

// storeExtensions returns the extensions the store supports: none in this
// version.
func storeExtensions(*outbox.Store) extensions { return extensions{} }

// streamGroup names one consumer group of one stream.
type streamGroup struct{ Stream, Group string }

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
