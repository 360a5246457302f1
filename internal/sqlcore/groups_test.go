package sqlcore

import (
	"strings"
	"testing"
)

// TestLifecycleStatements checks the group lifecycle statements of every
// dialect: each names only parameters its caller supplies, and every locking
// read takes its locks in id order (on SQLite the one writer makes order
// moot, and it has no FOR UPDATE).
func TestLifecycleStatements(t *testing.T) {
	known := map[string]bool{}
	for _, n := range []string{"stream", "group", "kind", "any_kind", "ids", "after", "limit"} {
		known[n] = true
	}
	for _, d := range []Dialect{Postgres, MySQL, SQLite} {
		s := newStatements(d).lifecycle
		all := map[string]query{
			"subscriptions": s.subscriptions, "activity": s.activity, "groupCounts": s.groupCounts,
			"schemaTable": s.schemaTable, "schemaVersion": s.schemaVersion,
			"deadOfGroup": s.deadOfGroup, "unsettledOfGroup": s.unsettledOfGroup, "pendingDefault": s.pendingDefault,
			"lockDead": s.lockDead, "lockUndelivered": s.lockUndelivered, "lockPending": s.lockPending,
			"copyPending": s.copyPending,
		}
		for name, q := range all {
			if q.text == "" {
				t.Errorf("%s %s: no statement", d, name)
			}
			for _, n := range q.names {
				if !known[n] {
					t.Errorf("%s %s: unexpected parameter @%s", d, name, n)
				}
			}
			if strings.Contains(q.text, "@") {
				t.Errorf("%s %s: uncompiled @ in %q", d, name, q.text)
			}
		}
		for _, name := range []string{"lockDead", "lockUndelivered", "lockPending"} {
			text := all[name].text
			want := "ORDER BY id FOR UPDATE"
			if d == SQLite {
				want = "ORDER BY id"
			}
			if !strings.HasSuffix(text, want) {
				t.Errorf("%s %s does not end in %q: %s", d, name, want, text)
			}
		}
		for _, name := range []string{"deadOfGroup", "unsettledOfGroup", "pendingDefault"} {
			if !strings.Contains(all[name].text, "ORDER BY") || strings.Contains(all[name].text, "FOR UPDATE") {
				t.Errorf("%s %s: candidates are read in id order without locks: %s", d, name, all[name].text)
			}
		}
	}
}
