package admin_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/millpond/millpond/admin"
	"github.com/millpond/millpond/outbox"
)

// TestPages renders every page over a seeded SQLite outbox, under a prefix:
// each answers, carries the security headers and shows no claim key.
func TestPages(t *testing.T) {
	f := newFixture(t, "sqlite")
	srv := f.serve(admin.Options{Prefix: "/ops/admin"})
	c := newClient(t)
	base := srv.URL + "/ops/admin"
	pages := map[string][]string{
		"/":                                  {"orders", "shipping", "(default)", `data-col="retrying">1<`},
		"/?fragment=grid":                    {`id="backlog"`},
		"/dead":                              {"connection refused by warehouse", "no handler for kind Audited", "Requeue selected"},
		"/dead?stream=orders&group=shipping": {"connection refused by warehouse"},
		"/dead?group=%28default%29":          {"no handler for kind Audited"},
		"/dead?q=WAREHOUSE":                  {"connection refused by warehouse"},
		"/dead?kind=Audited":                 {"no handler for kind Audited"},
		fmt.Sprintf("/events/%d", f.deadShipping):    {"order-1", "&#34;order&#34;: &#34;order-1&#34;", "connection refused by warehouse", "billing"},
		fmt.Sprintf("/events/%d", f.deadDefault):     {"plain text audit-1", "Reroute to the groups"},
		"/lookup":                                    {"By stream and key"},
		"/lookup?stream=orders&key=order-2":          {"2 stored deliveries found"},
		fmt.Sprintf("/lookup?id=%d", f.deadShipping): {"1 stored delivery found"},
		"/groups":           {"Consumer groups: registrations, backlog and last activity", "Unregister"},
		"/static/admin.js":  {"setupRefresh"},
		"/static/admin.css": {"focus-visible"},
	}
	for path, wants := range pages {
		status, body, h := get(t, c, base+path)
		if status != http.StatusOK {
			t.Errorf("GET %s: %d\n%s", path, status, body)
			continue
		}
		for _, w := range wants {
			if !strings.Contains(body, w) {
				t.Errorf("GET %s: no %q in\n%s", path, w, body)
			}
		}
		for _, k := range f.claimKeys {
			if strings.Contains(body, k) {
				t.Errorf("GET %s shows a claim key", path)
			}
		}
		checkSecurityHeaders(t, path, h)
	}
	// Filters exclude what they should.
	if _, body, _ := get(t, c, base+"/dead?q=warehouse"); strings.Contains(body, "no handler for kind") {
		t.Error("the error-text filter kept a dead letter it should drop")
	}
	if _, body, _ := get(t, c, base+"/dead?stream=audit"); strings.Contains(body, "warehouse") {
		t.Error("the stream filter kept a dead letter of another stream")
	}
	for path, want := range map[string]int{
		"/events/999999":        http.StatusNotFound,
		"/events/abc":           http.StatusNotFound,
		"/nowhere":              http.StatusNotFound,
		"/dead?stream=a%20b":    http.StatusBadRequest,
		"/lookup?id=-3":         http.StatusBadRequest,
		"/lookup?stream=orders": http.StatusBadRequest,
	} {
		if status, body, h := get(t, c, base+path); status != want {
			t.Errorf("GET %s: %d, want %d\n%s", path, status, want, body)
		} else {
			checkSecurityHeaders(t, path, h)
		}
	}
	// The bare prefix redirects to the overview.
	if status, _, h := get(t, c, srv.URL+"/ops/admin"); status/100 != 3 || h.Get("Location") != "/ops/admin/" {
		t.Errorf("bare prefix: %d to %q", status, h.Get("Location"))
	}
}

func checkSecurityHeaders(t *testing.T, path string, h http.Header) {
	t.Helper()
	csp := h.Get("Content-Security-Policy")
	for _, want := range []string{"script-src 'self'", "frame-ancestors 'none'", "default-src 'none'"} {
		if !strings.Contains(csp, want) {
			t.Errorf("%s: CSP %q lacks %q", path, csp, want)
		}
	}
	if strings.Contains(csp, "unsafe-inline") || strings.Contains(csp, "unsafe-eval") {
		t.Errorf("%s: CSP allows inline script: %q", path, csp)
	}
	for k, v := range map[string]string{"X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff",
		"Referrer-Policy": "no-referrer", "Cache-Control": "no-store"} {
		if h.Get(k) != v {
			t.Errorf("%s: %s is %q, want %q", path, k, h.Get(k), v)
		}
	}
}

// everyPath lists a request for every route, static files included.
func everyPath(f *fixture) [][2]string {
	return [][2]string{
		{"GET", "/"}, {"GET", "/?fragment=grid"}, {"GET", "/dead"}, {"GET", fmt.Sprintf("/events/%d", f.deadShipping)},
		{"GET", "/lookup?id=1"}, {"GET", "/groups"}, {"GET", "/static/admin.js"}, {"GET", "/static/admin.css"},
		{"GET", "/nowhere"}, {"POST", "/dead/confirm"}, {"POST", "/dead/apply"}, {"POST", "/groups/confirm"},
		{"POST", "/groups/apply"},
	}
}

// TestAuthorizeRunsOnEveryRequest: a refusing Authorize answers 403 (401
// for ErrUnauthenticated) on every path, static files and actions included,
// and changes nothing.
func TestAuthorizeRunsOnEveryRequest(t *testing.T) {
	f := newFixture(t, "sqlite")
	for _, tc := range []struct {
		err  error
		want int
	}{
		{errors.New("not an operator: secret-detail"), http.StatusForbidden},
		{fmt.Errorf("no session: %w", admin.ErrUnauthenticated), http.StatusUnauthorized},
	} {
		calls := 0
		srv := f.serve(admin.Options{Prefix: "/admin", Authorize: func(*http.Request) error { calls++; return tc.err }})
		c := newClient(t)
		for _, p := range everyPath(f) {
			var status int
			var body string
			if p[0] == "GET" {
				status, body, _ = get(t, c, srv.URL+"/admin"+p[1])
			} else {
				status, body = post(t, c, srv.URL+"/admin"+p[1], url.Values{"do": {"requeue:selected"},
					"sel": {fmt.Sprintf("orders|%d", f.deadShipping)}}, nil)
			}
			if status != tc.want {
				t.Errorf("%s %s: %d, want %d", p[0], p[1], status, tc.want)
			}
			if strings.Contains(body, "secret-detail") || strings.Contains(body, "orders") {
				t.Errorf("%s %s: the refusal shows data: %s", p[0], p[1], body)
			}
		}
		if calls != len(everyPath(f)) {
			t.Errorf("Authorize ran %d times for %d requests", calls, len(everyPath(f)))
		}
	}
	if got := f.status(f.deadShipping); got != outbox.StatusDead {
		t.Fatalf("a refused request changed the event: %s", got)
	}
}

// TestCSRF: an action needs the token of the browser's cookie and a
// same-origin request; anything else is refused with 403 and changes
// nothing.
func TestCSRF(t *testing.T) {
	f := newFixture(t, "sqlite")
	srv := f.serve(admin.Options{})
	c := newClient(t)
	tok := token(t, c, srv.URL+"/dead")
	form := func(tok string) url.Values {
		v := url.Values{"do": {"requeue:selected"}, "sel": {fmt.Sprintf("orders|%d", f.deadShipping)}}
		if tok != "" {
			v.Set("csrf_token", tok)
		}
		return v
	}
	other := newClient(t)
	otherTok := token(t, other, srv.URL+"/dead") // another browser's token
	for _, tc := range []struct {
		name    string
		client  *http.Client
		form    url.Values
		headers map[string]string
	}{
		{"no token", c, form(""), nil},
		{"wrong token", c, form("AAAA" + tok[4:]), nil},
		{"another browser's token", c, form(otherTok), nil},
		{"token without the cookie", newClient(t), form(tok), nil},
		{"cross-site", c, form(tok), map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"}},
		{"foreign origin", c, form(tok), map[string]string{"Sec-Fetch-Site": "", "Origin": "https://evil.example"}},
	} {
		for _, path := range []string{"/dead/confirm", "/dead/apply"} {
			status, body := post(t, tc.client, srv.URL+path, tc.form, tc.headers)
			if status != http.StatusForbidden {
				t.Errorf("%s, POST %s: %d, want 403\n%s", tc.name, path, status, body)
			}
		}
	}
	if got := f.status(f.deadShipping); got != outbox.StatusDead {
		t.Fatalf("a refused request requeued the event: %s", got)
	}
	// GET never acts.
	if status, _, _ := get(t, c, srv.URL+"/dead/apply?"+form(tok).Encode()); status != http.StatusMethodNotAllowed && status != http.StatusNotFound {
		t.Errorf("GET /dead/apply: %d", status)
	}
	// The right token, same origin: confirmation, then the action.
	status, body := post(t, c, srv.URL+"/dead/confirm", form(tok), nil)
	if status != http.StatusOK || !strings.Contains(body, "Requeue 1 dead letter") {
		t.Fatalf("confirm: %d\n%s", status, body)
	}
	if got := f.status(f.deadShipping); got != outbox.StatusDead {
		t.Fatalf("the confirmation page acted: %s", got)
	}
	status, body = post(t, c, srv.URL+"/dead/apply", form(tok), nil)
	if status != http.StatusOK || !strings.Contains(body, "Requeued 1 of 1 dead letters.") {
		t.Fatalf("apply: %d\n%s", status, body)
	}
	if got := f.status(f.deadShipping); got != outbox.StatusPending {
		t.Fatalf("after requeue: %s", got)
	}
}

// TestReadOnly: no action control is rendered, and a POST with a valid
// token (the same CSRF key as a writable handler) is refused with 403.
func TestReadOnly(t *testing.T) {
	f := newFixture(t, "sqlite")
	key := []byte("0123456789abcdef0123456789abcdef")
	writable := f.serve(admin.Options{CSRFKey: key})
	readOnly := f.serve(admin.Options{CSRFKey: key, ReadOnly: true})
	c := newClient(t)
	tok := token(t, c, writable.URL+"/dead")
	// The cookie is per host: copy it to the read-only server's URL.
	wu, _ := url.Parse(writable.URL)
	ru, _ := url.Parse(readOnly.URL)
	c.Jar.SetCookies(ru, c.Jar.Cookies(wu))

	for _, path := range []string{"/", "/dead", fmt.Sprintf("/events/%d", f.deadShipping), fmt.Sprintf("/events/%d", f.deadDefault), "/groups"} {
		_, body, _ := get(t, c, readOnly.URL+path)
		for _, bad := range []string{"<form method=\"post\"", "csrf_token", "Requeue", "Reroute", "type=\"checkbox\""} {
			if strings.Contains(body, bad) {
				t.Errorf("read-only %s renders %q", path, bad)
			}
		}
		if !strings.Contains(body, "Read-only") {
			t.Errorf("read-only %s does not say so", path)
		}
	}
	for _, do := range []string{"requeue:selected", "reroute:selected", "requeue:matching"} {
		for _, path := range []string{"/dead/confirm", "/dead/apply", "/groups/apply"} {
			form := url.Values{"csrf_token": {tok}, "do": {do}, "sel": {fmt.Sprintf("orders|%d", f.deadShipping), fmt.Sprintf("audit|%d", f.deadDefault)},
				"max_id": {"999999"}, "stream": {"orders"}, "group": {"shipping"}}
			if status, _ := post(t, c, readOnly.URL+path, form, nil); status != http.StatusForbidden {
				t.Errorf("read-only POST %s %s: %d, want 403", path, do, status)
			}
		}
	}
	if f.status(f.deadShipping) != outbox.StatusDead || f.status(f.deadDefault) != outbox.StatusDead {
		t.Fatal("a read-only request changed an event")
	}
	// The same form is accepted by the writable handler: the token was valid.
	status, _ := post(t, c, writable.URL+"/dead/confirm", url.Values{"csrf_token": {tok}, "do": {"requeue:selected"},
		"sel": {fmt.Sprintf("orders|%d", f.deadShipping)}}, nil)
	if status != http.StatusOK {
		t.Fatalf("writable confirm with the same token: %d", status)
	}
}

// hostRequest sends method to the UI at srv with the Host header host, as
// a browser that resolved host to this server (DNS rebinding) would, and
// as a same-origin page of host would post.
func hostRequest(t *testing.T, c *http.Client, method, u, host string, form url.Values) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, u, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", "http://"+host)
		req.Header.Set("Sec-Fetch-Site", "same-origin")
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestDNSRebindingIsRefused: a page of an attacker's domain that resolves
// to the UI's address is same-origin to the browser, which connects from
// the operator's machine: origin checks, the CSRF token (the page can read
// it) and an Authorize that trusts the client's address all pass. The Host
// header names the attacker's domain, and the UI answers only IP
// addresses and the names of Options.Hosts (default localhost).
func TestDNSRebindingIsRefused(t *testing.T) {
	f := newFixture(t, "sqlite")
	srv := f.serve(admin.Options{})
	c := newClient(t)
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
	const evil = "rebind.attacker.example"

	for _, path := range []string{"/dead?stream=audit", fmt.Sprintf("/events/%d", f.deadDefault), "/static/admin.css", "/"} {
		status, body := hostRequest(t, c, http.MethodGet, srv.URL+path, evil+":"+port, nil)
		if status != http.StatusMisdirectedRequest || strings.Contains(body, "csrf_token") || strings.Contains(body, "audit") {
			t.Errorf("GET %s for %s: %d, want 421 and nothing of the UI\n%s", path, evil, status, body)
		}
	}
	tok := token(t, c, srv.URL+"/dead") // the page could not have read it, but try with a valid one
	form := url.Values{"csrf_token": {tok}, "do": {"discard:selected"}, "sel": {fmt.Sprintf("audit|%d", f.deadDefault)}}
	if status, _ := hostRequest(t, c, http.MethodPost, srv.URL+"/dead/apply", evil+":"+port, form); status != http.StatusMisdirectedRequest {
		t.Errorf("POST for %s: %d, want 421", evil, status)
	}
	if got := f.status(f.deadDefault); got != outbox.StatusDead {
		t.Fatalf("the dead letter was changed through the rebound name: %s", got)
	}

	for _, host := range []string{"127.0.0.1:" + port, "[::1]:" + port, "localhost:" + port, "LOCALHOST.:" + port, "ui.localhost:" + port} {
		if status, _ := hostRequest(t, c, http.MethodGet, srv.URL+"/", host, nil); status != http.StatusOK {
			t.Errorf("GET / for %s: %d, want 200", host, status)
		}
	}
	for _, host := range []string{"evillocalhost:" + port, "localhost.attacker.example:" + port} {
		if status, _ := hostRequest(t, c, http.MethodGet, srv.URL+"/", host, nil); status != http.StatusMisdirectedRequest {
			t.Errorf("GET / for %q: %d, want 421", host, status)
		}
	}

	named := f.serve(admin.Options{Hosts: []string{"Ops.Example.com", "*.internal.example"}})
	for host, want := range map[string]int{
		"ops.example.com:" + port: http.StatusOK, "a.b.internal.example": http.StatusOK, "127.0.0.1": http.StatusOK,
		"localhost": http.StatusMisdirectedRequest, "internal.example": http.StatusMisdirectedRequest, evil: http.StatusMisdirectedRequest,
	} {
		if status, _ := hostRequest(t, c, http.MethodGet, named.URL+"/", host, nil); status != want {
			t.Errorf("Hosts set, GET / for %s: %d, want %d", host, status, want)
		}
	}
	if status, _ := hostRequest(t, c, http.MethodGet, f.serve(admin.Options{Hosts: []string{"*"}}).URL+"/", evil, nil); status != http.StatusOK {
		t.Errorf(`Hosts ["*"], GET / for %s: %d, want 200`, evil, status)
	}
	for _, bad := range []string{"ops.example.com:8081", "**.example", "*.", "a b", "http://ops", ""} {
		if _, err := admin.Handler(f.store, admin.Options{Hosts: []string{bad}}); err == nil {
			t.Errorf("host %q accepted", bad)
		}
	}
}

// TestCSRFCookieIsSecureOverHTTPS: the CSRF cookie is Secure when the
// browser reached the UI over HTTPS (a TLS-terminating proxy says so in
// X-Forwarded-Proto or Forwarded), or with Options.SecureCookie; over
// plain HTTP it is not (a browser would not keep a Secure cookie there).
func TestCSRFCookieIsSecureOverHTTPS(t *testing.T) {
	f := newFixture(t, "sqlite")
	plain := f.serve(admin.Options{})
	forced := f.serve(admin.Options{SecureCookie: true})
	for _, tc := range []struct {
		name    string
		url     string
		headers map[string]string
		secure  bool
	}{
		{"plain HTTP", plain.URL, nil, false},
		{"X-Forwarded-Proto https", plain.URL, map[string]string{"X-Forwarded-Proto": "https"}, true},
		{"X-Forwarded-Proto HTTPS, http", plain.URL, map[string]string{"X-Forwarded-Proto": "HTTPS, http"}, true},
		{"X-Forwarded-Proto http", plain.URL, map[string]string{"X-Forwarded-Proto": "http"}, false},
		{"Forwarded proto=https", plain.URL, map[string]string{"Forwarded": `for=192.0.2.60;proto="https";by=203.0.113.43`}, true},
		{"Forwarded proto=http", plain.URL, map[string]string{"Forwarded": "for=192.0.2.60;proto=http, proto=https"}, false},
		{"SecureCookie", forced.URL, nil, true},
	} {
		req, err := http.NewRequest(http.MethodGet, tc.url+"/dead", nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range tc.headers {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		var found bool
		for _, c := range resp.Cookies() {
			if c.Name == "millpond_admin_csrf" {
				found = true
				if c.Secure != tc.secure || !c.HttpOnly || c.SameSite != http.SameSiteLaxMode {
					t.Errorf("%s: cookie Secure %v HttpOnly %v SameSite %v, want Secure %v, HttpOnly, Lax", tc.name, c.Secure, c.HttpOnly, c.SameSite, tc.secure)
				}
			}
		}
		if !found {
			t.Errorf("%s: GET /dead set no CSRF cookie (status %d)", tc.name, resp.StatusCode)
		}
	}
}
