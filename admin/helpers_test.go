package admin_test

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/millpond/millpond/admin"
	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// fixture is an isolated database with a known backlog, and its store.
type fixture struct {
	t     *testing.T
	db    *testdb.Database
	store *outbox.Store
	// claimKeys are claim keys handed out while seeding; no page may show
	// one.
	claimKeys []string
	// deadShipping is a dead letter of group shipping (stream orders);
	// deadDefault one of the default group of stream audit.
	deadShipping, deadDefault int64
}

// newFixture seeds: stream orders with groups billing and shipping, three
// events (six rows): billing has one delivered, one in flight, one pending;
// shipping one dead, one retrying, one pending. Stream audit has no group:
// two events in the default group, one dead, one pending.
func newFixture(t *testing.T, dialect string) *fixture {
	t.Helper()
	db := testdb.New(t, dialect)
	f := &fixture{t: t, db: db, store: db.Store(t, outbox.WithoutListen())}
	ctx := context.Background()
	for _, g := range []string{"billing", "shipping"} {
		if err := f.store.RegisterGroup(ctx, "orders", g); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range []string{"order-1", "order-2", "order-3"} {
		f.enqueue(outbox.Event{Stream: "orders", Key: k, Kind: "OrderPlaced", Payload: []byte(`{"order":"` + k + `","qty":2}`)})
	}
	for _, k := range []string{"audit-1", "audit-2"} {
		f.enqueue(outbox.Event{Stream: "audit", Key: k, Kind: "Audited", Payload: []byte("plain text " + k)})
	}
	billing := f.claim("orders", "billing", 2)
	if err := f.store.Acknowledge(ctx, billing[0].Receipt()); err != nil {
		t.Fatal(err)
	}
	shipping := f.claim("orders", "shipping", 2)
	f.fail(shipping[0], "connection refused by warehouse", 1)
	f.fail(shipping[1], "timeout", 5)
	f.deadShipping = shipping[0].ID
	audit := f.claim("audit", "", 1)
	f.fail(audit[0], "no handler for kind Audited", 1)
	f.deadDefault = audit[0].ID
	return f
}

func (f *fixture) enqueue(ev outbox.Event) int64 {
	f.t.Helper()
	tx, commit, rollback := f.db.Begin(f.t)
	res, err := f.store.Enqueue(context.Background(), tx, ev)
	if err != nil {
		rollback()
		f.t.Fatal(err)
	}
	if err := commit(); err != nil {
		f.t.Fatal(err)
	}
	return res.ID
}

func (f *fixture) claim(stream, group string, n int) []outbox.Claimed {
	f.t.Helper()
	cs, err := f.store.Claim(context.Background(), outbox.ClaimRequest{Stream: stream, Group: group, Worker: "test-worker",
		Limit: n, Lease: time.Hour, MaxAttempts: 5})
	if err != nil || len(cs) != n {
		f.t.Fatalf("claim %s/%s: %d claimed, %v", stream, group, len(cs), err)
	}
	for _, c := range cs {
		f.claimKeys = append(f.claimKeys, c.ClaimKey)
	}
	return cs
}

func (f *fixture) fail(c outbox.Claimed, reason string, maxAttempts int) {
	f.t.Helper()
	if _, err := f.store.Fail(context.Background(), c.Receipt(), outbox.Failure{Reason: reason, MaxAttempts: maxAttempts, RetryDelay: time.Hour}); err != nil {
		f.t.Fatal(err)
	}
}

// status reads a row's status straight from the table.
func (f *fixture) status(id int64) string {
	f.t.Helper()
	rows, err := f.store.FindEvents(context.Background(), outbox.EventQuery{ID: id})
	if err != nil || len(rows) != 1 {
		f.t.Fatalf("find %d: %v, %v", id, rows, err)
	}
	return rows[0].Status
}

// serve starts the admin UI over the fixture's store.
func (f *fixture) serve(opts admin.Options) *httptest.Server {
	f.t.Helper()
	h, err := admin.Handler(f.store, opts)
	if err != nil {
		f.t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(opts.Prefix+"/", h)
	srv := httptest.NewServer(mux)
	f.t.Cleanup(srv.Close)
	return srv
}

// client is a browser-like HTTP client: it keeps cookies and does not
// follow redirects.
func newClient(t *testing.T) *http.Client {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Jar: jar, Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func get(t *testing.T, c *http.Client, u string) (int, string, http.Header) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

// post sends a form as a same-origin browser would (Origin and
// Sec-Fetch-Site), unless headers override them.
func post(t *testing.T, c *http.Client, u string, form url.Values, headers map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, u, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	pu, _ := url.Parse(u)
	req.Header.Set("Origin", pu.Scheme+"://"+pu.Host)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	for k, v := range headers {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

var tokenRE = regexp.MustCompile(`name="csrf_token" value="([^"]+)"`)

// token fetches a page and returns the CSRF token of its forms.
func token(t *testing.T, c *http.Client, u string) string {
	t.Helper()
	status, body, _ := get(t, c, u)
	m := tokenRE.FindStringSubmatch(body)
	if status != http.StatusOK || m == nil {
		t.Fatalf("GET %s: %d, no CSRF token in the page", u, status)
	}
	return m[1]
}
