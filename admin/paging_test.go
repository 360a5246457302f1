package admin_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/millpond/millpond/admin"
	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

var nextLinkRE = regexp.MustCompile(`href="/dead\?([^"]*)" rel="next"`)

// seedDead makes n dead letters of stream "paged" in the default group.
func seedDead(t *testing.T, db *testdb.Database, store *outbox.Store, n int) {
	t.Helper()
	ctx := context.Background()
	tx, commit, rollback := db.Begin(t)
	for i := range n {
		if _, err := store.Enqueue(ctx, tx, outbox.Event{Stream: "paged", Key: fmt.Sprintf("k-%d", i), Kind: "Paged", Payload: []byte("{}")}); err != nil {
			rollback()
			t.Fatal(err)
		}
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}
	cs, err := store.Claim(ctx, outbox.ClaimRequest{Stream: "paged", Worker: "w", Limit: n, Lease: time.Hour, MaxAttempts: 1})
	if err != nil || len(cs) != n {
		t.Fatalf("claim: %d, %v", len(cs), err)
	}
	for _, c := range cs {
		if _, err := store.Fail(ctx, c.Receipt(), outbox.Failure{Reason: "poison", MaxAttempts: 1}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDeadListLastPageHasNoNextLink: a filter that matches exactly a page
// of dead letters (50), or a page and a half, must not offer a next page
// that turns out empty, nor say that more follow when none do.
func TestDeadListLastPageHasNoNextLink(t *testing.T) {
	for _, n := range []int{50, 75} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			db := testdb.New(t, "sqlite")
			store := db.Store(t, outbox.WithoutListen())
			seedDead(t, db, store, n)
			h, err := admin.Handler(store, admin.Options{})
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(h)
			t.Cleanup(srv.Close)
			c := newClient(t)
			u := srv.URL + "/dead?stream=paged"
			shown := 0
			for page := 1; ; page++ {
				status, body, _ := get(t, c, u)
				if status != http.StatusOK {
					t.Fatalf("page %d: %d", page, status)
				}
				rows := strings.Count(body, `<tr data-id=`)
				shown += rows
				if rows == 0 {
					t.Fatalf("page %d is empty: the page before it offered a next page (%d of %d shown)", page, shown, n)
				}
				// Every page after the first links back to it, with the filter.
				if hasFirst := strings.Contains(body, `href="/dead?stream=paged" rel="first"`); hasFirst != (page > 1) {
					t.Fatalf("page %d: link to the first page %v, want %v", page, hasFirst, page > 1)
				}
				next := nextLinkRE.FindStringSubmatch(body)
				if strings.Contains(body, "more follow") != (next != nil) {
					t.Fatalf("page %d: says more follow %v, next link %v", page, strings.Contains(body, "more follow"), next != nil)
				}
				if next == nil {
					break
				}
				u = srv.URL + "/dead?" + strings.ReplaceAll(next[1], "&amp;", "&")
			}
			if shown != n {
				t.Fatalf("%d dead letters shown over the pages, want %d", shown, n)
			}
		})
	}
}
