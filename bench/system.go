package main

import (
	"context"
	"fmt"
	"slices"
	"sort"
)

// Handler is called by a system's consumers once per delivered event, with
// the payload that was passed to Enqueue (handle) or, for systems that
// decode the payload themselves, with the event id it carries (handleID).
// The system acknowledges the event after the call returns.
type Handler interface {
	handle(payload []byte)
	handleID(id int64)
}

// System is one outbox/queue implementation under test. Every system is run
// through the same workload against the same database; adding a system means
// writing one file that implements this interface and calls register from an
// init function.
type System interface {
	// Setup creates the system's schema (tables, migrations). It is called
	// once, before Reset.
	Setup(ctx context.Context, db *database) error
	// Reset leaves the system's tables empty.
	Reset(ctx context.Context) error
	// Prefill inserts n events that are already delivered and acknowledged,
	// in whatever form the system keeps such rows, so that runs can measure
	// behaviour on a table that has history in it. It should leave the
	// table vacuumed and analyzed, as a long-running table would be.
	Prefill(ctx context.Context, n int) error
	// Enqueue adds one event inside the caller's transaction; the event must
	// become visible to consumers only if tx commits.
	Enqueue(ctx context.Context, tx *benchTx, payload []byte) error
	// Start starts the consumers (Options.Workers of them) that call
	// handler for each event and then acknowledge it. It returns once the
	// consumers are running.
	Start(ctx context.Context, handler Handler) error
	// Stop stops the consumers started by Start and waits for them to exit.
	Stop(ctx context.Context) error
}

// Options are the run settings a system is constructed with.
type Options struct {
	// Workers is the number of concurrent consumers.
	Workers int
}

// systemInfo describes a registered system.
type systemInfo struct {
	name  string // value used in -systems
	label string // name shown in the results table
	notes string // configuration worth knowing when reading the results
	order int    // position in the default system list and the table
	// dialects the system runs on (PostgreSQL only when empty).
	dialects []string
	// extra marks a variant left out of the default system list.
	extra bool
	// prefill, when set, replaces -prefill for this system: a variant that
	// measures the same system on a table with history in it.
	prefill int
	new     func(Options) System
}

var registry = map[string]systemInfo{}

// register adds a system to the registry; call it from an init function.
func register(info systemInfo) {
	if _, dup := registry[info.name]; dup {
		panic(fmt.Sprintf("system %q registered twice", info.name))
	}
	registry[info.name] = info
}

// registeredNames returns the registered system names in table order.
func registeredNames() []string {
	names := make([]string, 0, len(registry))
	for name := range registry {
		names = append(names, name)
	}
	sort.Slice(names, func(i, j int) bool {
		a, b := registry[names[i]], registry[names[j]]
		if a.order != b.order {
			return a.order < b.order
		}
		return a.name < b.name
	})
	return names
}

// runsOn reports whether the system runs on the dialect.
func (i systemInfo) runsOn(dialect string) bool {
	if len(i.dialects) == 0 {
		return dialect == dialectPostgres
	}
	return slices.Contains(i.dialects, dialect)
}
