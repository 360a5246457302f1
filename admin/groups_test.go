package admin_test

import (
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/millpond/millpond/admin"
	"github.com/millpond/millpond/outbox"
)

// TestGroupsAndDiscard: the groups page lists every group with its
// registration and backlog; unregistering is refused while a group has
// pending or processing events, done with its events discarded after a
// confirmation; a dead letter is discarded after a confirmation. Read-only
// mode renders neither action.
func TestGroupsAndDiscard(t *testing.T) {
	f := newFixture(t, "sqlite")
	srv := f.serve(admin.Options{})
	c := newClient(t)

	_, body, _ := get(t, c, srv.URL+"/groups")
	for _, want := range []string{`data-stream="orders" data-group="billing"`, `data-stream="orders" data-group="shipping"`,
		`data-stream="audit" data-group=""`, "Unregister<span class=\"visually-hidden\"> group shipping of stream orders",
		// A group's dead letters link to their list, the default group's too.
		`href="/dead?group=shipping&amp;stream=orders"`, `href="/dead?group=%28default%29&amp;stream=audit"`} {
		if !strings.Contains(body, want) {
			t.Errorf("the groups page lacks %q", want)
		}
	}
	if strings.Contains(body, "not available in this version") {
		t.Error("the groups page says group listing is not available")
	}

	tok := token(t, c, srv.URL+"/groups")
	form := url.Values{"csrf_token": {tok}, "stream": {"orders"}, "group": {"shipping"}}
	if status, body := post(t, c, srv.URL+"/groups/confirm", form, nil); status != http.StatusOK || !strings.Contains(body, "shipping") {
		t.Fatalf("confirm unregister: %d\n%s", status, body)
	}
	if status, body := post(t, c, srv.URL+"/groups/apply", form, nil); status != http.StatusConflict || !strings.Contains(body, "2 pending") {
		t.Fatalf("unregister a group with a backlog: %d, want 409 naming its pending event\n%s", status, body)
	}
	regs, err := f.store.RegisteredGroups(t.Context(), "orders")
	if err != nil || len(regs) != 2 {
		t.Fatalf("a refused unregister changed the registrations: %v, %v", regs, err)
	}
	form.Set("discard", "1")
	if status, body := post(t, c, srv.URL+"/groups/apply", form, nil); status != http.StatusOK || !strings.Contains(body, "Unregistered the group shipping") {
		t.Fatalf("unregister with discard: %d\n%s", status, body)
	}
	if regs, _ := f.store.RegisteredGroups(t.Context(), "orders"); len(regs) != 1 || regs[0].Group != "billing" {
		t.Fatalf("after unregistering shipping: %v", regs)
	}
	// Submitted again (a double click, a stale page): not a database failure.
	if status, body := post(t, c, srv.URL+"/groups/apply", form, nil); status != http.StatusConflict || !strings.Contains(body, "is not registered") {
		t.Errorf("unregister an unregistered group: %d, want 409 saying it is not registered\n%s", status, body)
	}
	if rows, _ := f.store.FindEvents(t.Context(), outbox.EventQuery{ID: f.deadShipping}); len(rows) != 0 {
		t.Fatalf("the discarded group's dead letter is still stored: %v", rows)
	}

	// Discard one dead letter: confirmation first, which changes nothing.
	sel := url.Values{"csrf_token": {tok}, "do": {"discard:selected"}, "sel": {fmt.Sprintf("audit|%d", f.deadDefault)}}
	if status, body := post(t, c, srv.URL+"/dead/confirm", sel, nil); status != http.StatusOK || !strings.Contains(body, "Discard 1 dead letter") {
		t.Fatalf("confirm discard: %d\n%s", status, body)
	}
	if got := f.status(f.deadDefault); got != outbox.StatusDead {
		t.Fatalf("the confirmation discarded: %s", got)
	}
	if status, body := post(t, c, srv.URL+"/dead/apply", sel, nil); status != http.StatusOK || !strings.Contains(strings.ToLower(body), "discarded 1 of 1") {
		t.Fatalf("apply discard: %d\n%s", status, body)
	}
	if rows, _ := f.store.FindEvents(t.Context(), outbox.EventQuery{ID: f.deadDefault}); len(rows) != 0 {
		t.Fatalf("the discarded dead letter is still stored: %v", rows)
	}

	readOnly := f.serve(admin.Options{ReadOnly: true})
	for _, path := range []string{"/groups", "/dead?stream=audit"} {
		_, body, _ := get(t, c, readOnly.URL+path)
		if strings.Contains(body, "Unregister") || strings.Contains(body, "Discard") {
			t.Errorf("read-only %s renders an action", path)
		}
	}
}

// TestOverviewShowsBlockedAndHeldKeys: events waiting behind their ordering
// key and keys held by a dead letter show in the overview, as Stats counts
// them.
func TestOverviewShowsBlockedAndHeldKeys(t *testing.T) {
	f := newFixture(t, "sqlite")
	for _, k := range []string{"k1", "k2", "k3"} {
		f.enqueue(outbox.Event{Stream: "ledger", Key: k, Kind: "Posted", OrderingKey: "acct-7", Payload: []byte(`{}`)})
	}
	head := f.claim("ledger", "", 1)
	f.fail(head[0], "poison", 1) // dead under hold: the key stays held
	srv := f.serve(admin.Options{})
	_, body, _ := get(t, newClient(t), srv.URL+"/")
	row := body[strings.Index(body, `data-stream="ledger"`):]
	row = row[:strings.Index(row, "</tr>")]
	for _, want := range []string{`data-col="blocked">2<`, `data-col="held">1<`} {
		if !strings.Contains(row, want) {
			t.Errorf("the ledger row lacks %s:\n%s", want, row)
		}
	}
}

// TestActOnEverythingMatching: requeue of everything matching a filter
// touches exactly the dead letters that match it, and only those that
// existed when the operator confirmed (up to max_id); reroute of a
// default-group dead letter hands it to the group that takes its kind now.
func TestActOnEverythingMatching(t *testing.T) {
	f := newFixture(t, "sqlite")
	srv := f.serve(admin.Options{})
	c := newClient(t)
	tok := token(t, c, srv.URL+"/dead")

	// Another dead letter of shipping whose error does not match the filter.
	f.enqueue(outbox.Event{Stream: "orders", Key: "order-4", Kind: "OrderPlaced", Payload: []byte(`{}`)})
	var other int64
	for _, cl := range f.claim("orders", "shipping", 2) {
		if cl.Key == "order-4" {
			f.fail(cl, "card declined", 1)
			other = cl.ID
		} else {
			f.fail(cl, "timeout again", 5)
		}
	}
	form := url.Values{"csrf_token": {tok}, "do": {"requeue:matching"}, "stream": {"orders"}, "q": {"warehouse"}}
	status, body := post(t, c, srv.URL+"/dead/confirm", form, nil)
	if status != http.StatusOK || !strings.Contains(body, "Requeue 1 dead letter") {
		t.Fatalf("confirm requeue of everything matching: %d\n%s", status, body)
	}
	m := regexp.MustCompile(`name="max_id" value="(\d+)"`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("the confirmation carries no max_id:\n%s", body)
	}
	form.Set("max_id", m[1])
	form.Set("confirmed", confirmedDigest(t, body))
	// A matching dead letter that arrives after the confirmation is not
	// swept up unseen.
	f.enqueue(outbox.Event{Stream: "orders", Key: "order-5", Kind: "OrderPlaced", Payload: []byte(`{}`)})
	var late int64
	for _, cl := range f.claim("orders", "shipping", 1) {
		f.fail(cl, "connection refused by warehouse again", 1)
		late = cl.ID
	}
	if status, body := post(t, c, srv.URL+"/dead/apply", form, nil); status != http.StatusOK || !strings.Contains(body, "Requeued 1 of 1") {
		t.Fatalf("apply: %d\n%s", status, body)
	}
	for id, want := range map[int64]string{f.deadShipping: outbox.StatusPending, other: outbox.StatusDead, late: outbox.StatusDead} {
		if got := f.status(id); got != want {
			t.Errorf("event %d: %s, want %s", id, got, want)
		}
	}

	// Reroute: the default group's dead letter of kind Audited goes to the
	// group registered for it now.
	if err := f.store.RegisterGroup(t.Context(), "audit", "auditors", "Audited"); err != nil {
		t.Fatal(err)
	}
	sel := url.Values{"csrf_token": {tok}, "do": {"reroute:selected"}, "sel": {fmt.Sprintf("audit|%d", f.deadDefault)}}
	if status, body := post(t, c, srv.URL+"/dead/apply", sel, nil); status != http.StatusOK {
		t.Fatalf("reroute: %d\n%s", status, body)
	}
	got, err := f.store.Claim(t.Context(), outbox.ClaimRequest{Stream: "audit", Group: "auditors", Worker: "w", Limit: 10, Lease: time.Minute, MaxAttempts: 3})
	if err != nil || len(got) != 1 || got[0].Key != "audit-1" {
		t.Fatalf("the rerouted event for auditors: %v, %v", got, err)
	}
}

// confirmedDigest is the confirmation page's digest of the dead letters it
// showed.
func confirmedDigest(t *testing.T, body string) string {
	t.Helper()
	m := regexp.MustCompile(`name="confirmed" value="([0-9a-f]+)"`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("the confirmation carries no digest of what it showed:\n%s", body)
	}
	return m[1]
}

// TestActOnEverythingMatchingRefusesUnseenDeadLetters: ids are given at
// enqueue, not at death, so an event in flight at the confirmation can die
// below the highest confirmed id afterwards. The action then changes
// nothing (409) instead of sweeping it up unseen; confirmed again, it
// applies to all it shows.
func TestActOnEverythingMatchingRefusesUnseenDeadLetters(t *testing.T) {
	f := newFixture(t, "sqlite")
	srv := f.serve(admin.Options{})
	c := newClient(t)
	tok := token(t, c, srv.URL+"/dead")

	f.enqueue(outbox.Event{Stream: "orders", Key: "order-6", Kind: "OrderPlaced", Payload: []byte(`{}`)})
	inFlight := f.claim("orders", "shipping", 1)[0]
	f.enqueue(outbox.Event{Stream: "orders", Key: "order-7", Kind: "OrderPlaced", Payload: []byte(`{}`)})
	seen := f.claim("orders", "shipping", 1)[0]
	f.fail(seen, "connection refused by warehouse", 1)
	if inFlight.ID >= seen.ID {
		t.Fatalf("ids %d and %d: the in-flight event must have the lower id", inFlight.ID, seen.ID)
	}

	form := url.Values{"csrf_token": {tok}, "do": {"discard:matching"}, "stream": {"orders"}, "q": {"warehouse"}}
	status, body := post(t, c, srv.URL+"/dead/confirm", form, nil)
	if status != http.StatusOK || !strings.Contains(body, "Discard 2 dead letters") {
		t.Fatalf("confirm: %d\n%s", status, body)
	}
	form.Set("max_id", regexp.MustCompile(`name="max_id" value="(\d+)"`).FindStringSubmatch(body)[1])
	form.Set("confirmed", confirmedDigest(t, body))
	f.fail(inFlight, "connection refused by warehouse too", 1) // dies after the confirmation

	status, body = post(t, c, srv.URL+"/dead/apply", form, nil)
	if status != http.StatusConflict || !strings.Contains(body, "3 match now") {
		t.Fatalf("apply after an unseen dead letter: %d, want 409\n%s", status, body)
	}
	for _, id := range []int64{f.deadShipping, seen.ID, inFlight.ID} {
		if got := f.status(id); got != outbox.StatusDead {
			t.Errorf("event %d: %s, want it still dead: nothing changes", id, got)
		}
	}

	status, body = post(t, c, srv.URL+"/dead/confirm", form, nil)
	if status != http.StatusOK || !strings.Contains(body, "Discard 3 dead letters") {
		t.Fatalf("confirm again: %d\n%s", status, body)
	}
	form.Set("max_id", regexp.MustCompile(`name="max_id" value="(\d+)"`).FindStringSubmatch(body)[1])
	form.Set("confirmed", confirmedDigest(t, body))
	if status, body := post(t, c, srv.URL+"/dead/apply", form, nil); status != http.StatusOK || !strings.Contains(body, "Discarded 3 of 3") {
		t.Fatalf("apply: %d\n%s", status, body)
	}

	// A form without the digest (an old page) is sent back to confirm.
	form.Del("confirmed")
	if status, _ := post(t, c, srv.URL+"/dead/apply", form, nil); status != http.StatusBadRequest {
		t.Errorf("apply without a digest: %d, want 400", status)
	}
}

// TestGroupConfirmCountsWhatDiscardDeletes: the confirmation page of
// unregistering a group offered "also discard the group's undelivered
// events" without saying how many that deletes for good. It now names the
// group's pending, in-flight and dead-lettered counts, and says when there
// is nothing to discard.
func TestGroupConfirmCountsWhatDiscardDeletes(t *testing.T) {
	f := newFixture(t, "sqlite")
	srv := f.serve(admin.Options{})
	c := newClient(t)
	tok := token(t, c, srv.URL+"/groups")
	form := url.Values{"csrf_token": {tok}, "stream": {"orders"}, "group": {"shipping"}}
	status, body := post(t, c, srv.URL+"/groups/confirm", form, nil)
	if status != http.StatusOK {
		t.Fatalf("confirm unregister: %d\n%s", status, body)
	}
	text := regexp.MustCompile(`\s+`).ReplaceAllString(regexp.MustCompile(`<[^>]*>`).ReplaceAllString(body, ""), " ")
	if want := "discard its 3 undelivered events for good (2 pending, 0 in flight, 1 dead-lettered"; !strings.Contains(text, want) {
		t.Errorf("the confirmation does not say what the discard deletes: want %q in\n%s", want, text)
	}
	// A group with nothing undelivered: nothing to discard, no checkbox.
	if err := f.store.RegisterGroup(t.Context(), "orders", "idle"); err != nil {
		t.Fatal(err)
	}
	form.Set("group", "idle")
	status, body = post(t, c, srv.URL+"/groups/confirm", form, nil)
	if status != http.StatusOK || !strings.Contains(body, "has no undelivered events") || strings.Contains(body, `name="discard"`) {
		t.Errorf("confirm unregister of an idle group: %d\n%s", status, body)
	}
}
