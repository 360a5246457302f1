package tests

import (
	"fmt"
	"sort"
	"testing"
	"time"
)

// testClaimsReadOnlyWhatTheyTake: a small claim from a group with a large
// backlog costs about what it costs from a group with a small one. (On
// MariaDB a claim over status IN ('pending', 'processing') used to read and
// sort every unsettled row of the group: about 20 ms with 5,000 pending.)
func testClaimsReadOnlyWhatTheyTake(t *testing.T, e *env) {
	fill := func(stream string, n int) {
		tx, commit, rollback := e.db.Begin(t)
		for i := range n {
			if _, err := e.s.Enqueue(e.ctx, tx, event(stream, fmt.Sprintf("e%05d", i))); err != nil {
				rollback()
				t.Fatal(err)
			}
		}
		if err := commit(); err != nil {
			t.Fatal(err)
		}
	}
	const big, small, claims, limit = 5_000, 300, 15, 10
	if e.db.Dialect == "postgres" {
		// Rows of another stream before the backlog, in id order: a claim
		// that walked the primary key in id order (the planner's choice
		// when the stream is a large part of the table) would filter its
		// way through all of them (issue 11's claim-cost run: 53 ms behind
		// 100,000 rows against 4 ms).
		fill("before", 20_000)
	}
	fill("big", big)
	fill("small", small)
	if e.db.Dialect == "postgres" {
		e.db.Exec(t, "ANALYZE millpond_events, millpond_deliveries")
	}
	// The claims of the streams alternate, so that a burst of load on a
	// shared machine slows both medians alike.
	streams := []string{"big", "small"}
	if e.db.Dialect == "postgres" {
		streams = append(streams, "before")
	}
	claim := func(stream string) time.Duration {
		start := time.Now()
		if got := e.claim(claimReq(stream, limit, time.Minute, 3)); len(got) != limit {
			t.Fatalf("claimed %d of %s, want %d", len(got), stream, limit)
		}
		return time.Since(start)
	}
	claim("small") // warm up
	took := map[string][]time.Duration{}
	for range claims {
		for _, stream := range streams {
			took[stream] = append(took[stream], claim(stream))
		}
	}
	median := func(stream string) time.Duration {
		ds := took[stream]
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		return ds[len(ds)/2]
	}
	backlog, few := median("big"), median("small")
	t.Logf("median claim of %d: %s with %d pending, %s with %d pending", limit, backlog, big, few, small)
	if backlog > 3*few+2*time.Millisecond {
		t.Fatalf("a claim of %d takes %s behind %d pending events, %s behind %d", limit, backlog, big, few, small)
	}
	if e.db.Dialect == "postgres" {
		// The stream at the start of the id order (where a walk of the
		// primary key finds its rows at once) is no faster.
		first := median("before")
		t.Logf("median claim of %d: %s from the first stream in id order", limit, first)
		if backlog > 3*first+2*time.Millisecond {
			t.Fatalf("a claim of %d takes %s behind another stream's rows, %s from the first stream", limit, backlog, first)
		}
	}
	if st := e.stats("big", ""); st.Processing != claims*limit {
		t.Fatalf("stats after the claims: %+v", st)
	}
}
