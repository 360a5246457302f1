package tests

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// TestCachedStatsIgnoresACallerThatGaveUp: the stats snapshot is shared by
// the backlog gauges, readiness probes and CachedStats. A caller whose own
// context ended while the query ran (a readiness probe that timed out, a
// client that disconnected) got a context error, and that error was cached
// for the whole interval: every gauge then reported nothing until the
// interval passed, though the database was fine. That caller gets its
// error; the next caller reads the database again.
func TestCachedStatsIgnoresACallerThatGaveUp(t *testing.T) {
	// The cache is the same on every dialect.
	db := testdb.New(t, "postgres")
	rig := newTelemetryRig(t)
	store := db.Store(t, rig.options(outbox.WithStatsInterval(time.Hour))...)
	ctx := context.Background()
	tx, commit, rollback := db.Begin(t)
	if _, err := store.Enqueue(ctx, tx, outbox.Event{Stream: "probe", Key: "k", Kind: "K", Payload: []byte("{}")}); err != nil {
		rollback()
		t.Fatal(err)
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if _, _, err := store.CachedStats(gone); err == nil {
		t.Fatal("CachedStats with a cancelled context: no error")
	}
	if stats, _, err := store.CachedStats(ctx); err != nil || len(stats) != 1 {
		t.Fatalf("CachedStats after a caller gave up: %v, %v; want the database's one stream", stats, err)
	}
	rm := rig.collect(t)
	if v, ok := metricValue(rm, "millpond.backlog", attribute.String("messaging.destination.name", "probe"), outbox.AttrState.String("pending")); !ok || v != 1 {
		t.Fatalf("backlog gauge after a caller gave up: %v (reported %v), want 1", v, ok)
	}
}

// TestCachedStatsCallersGetTheirOwnCopy: a caller that changes the slice
// CachedStats returned (sorting it, zeroing a count) changes neither what
// the next caller gets nor what the gauges report.
func TestCachedStatsCallersGetTheirOwnCopy(t *testing.T) {
	db := testdb.New(t, "postgres")
	store := db.Store(t, outbox.WithStatsInterval(time.Hour))
	ctx := context.Background()
	for _, stream := range []string{"a", "b"} {
		tx, commit, _ := db.Begin(t)
		if _, err := store.Enqueue(ctx, tx, outbox.Event{Stream: stream, Key: "k", Kind: "K", Payload: []byte("{}")}); err != nil {
			t.Fatal(err)
		}
		if err := commit(); err != nil {
			t.Fatal(err)
		}
	}
	// The first call reads the database, the others the cached snapshot:
	// each one's result is changed before the next call.
	for call := range 3 {
		got, _, err := store.CachedStats(ctx)
		if err != nil || len(got) != 2 {
			t.Fatalf("CachedStats call %d: %v, %v", call, got, err)
		}
		for _, st := range got {
			if st.Stream == "changed" || st.Pending != 1 {
				t.Errorf("call %d: a caller's change reached the next caller: %+v", call, st)
			}
		}
		got[0].Pending, got[0].Stream = 99, "changed"
	}
}
