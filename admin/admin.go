// Package admin is millpond's operator web UI: an http.Handler that shows
// the outbox's backlog per stream and consumer group, lists dead letters
// with their details, looks events up by id or key, and, after a
// confirmation step, requeues, reroutes or discards dead letters and
// unregisters consumer groups.
//
// Mount it under a prefix of an existing server:
//
//	h, err := admin.Handler(store, admin.Options{Prefix: "/admin", ReadOnly: true,
//		Authorize: func(r *http.Request) error { return checkOperator(r) }})
//	if err != nil { return err }
//	mux.Handle("/admin/", h)
//
// or run it alone with the command line tool: millpond ui -addr
// 127.0.0.1:8081.
//
// The pages are rendered by html/template from files embedded in the
// package, with one small script (plain JavaScript, embedded too: it works
// offline and needs no build step) that refreshes the overview and toggles
// selections; everything works without it except the automatic refresh.
//
// Security: only requests for an IP address or a host of Options.Hosts
// (default localhost) are answered, which refuses DNS rebinding.
// Authorize runs before every request, static files included.
// Actions are POST only and carry a CSRF token (an HMAC of a per-browser
// cookie, see Options.CSRFKey); cross-origin POSTs are refused by their
// Sec-Fetch-Site and Origin headers too. ReadOnly hides every action and
// refuses their requests with 403. Every response carries a
// Content-Security-Policy without inline script, frame-ancestors 'none' and
// X-Frame-Options DENY, nosniff, Referrer-Policy no-referrer and
// Cache-Control no-store. Claim keys are never rendered; payloads and
// metadata appear only in an event's detail page, and nothing of an event
// but counts and ids is logged. Event keys, streams and ordering keys are
// shown (the UI is for operators, who need them); a lookup by key is a GET
// form, so the key searched for is in that page's URL: in the browser's
// history and in the access log of a server or proxy in front of the UI,
// if it logs query strings.
package admin

import (
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/millpond/millpond/outbox"
)

// ErrUnauthenticated, returned (or wrapped) by Options.Authorize, answers
// 401 Unauthorized instead of 403 Forbidden.
var ErrUnauthenticated = errors.New("admin: not authenticated")

// DefaultRefreshInterval is how often the overview refreshes itself when
// Options.RefreshInterval is zero.
const DefaultRefreshInterval = 5 * time.Second

// Options configures the admin UI.
type Options struct {
	// ReadOnly hides every action (requeue, reroute, discard, unregister)
	// and refuses their POST requests with 403 Forbidden.
	ReadOnly bool
	// Prefix is the path the handler is mounted at, such as "/admin"
	// (without a trailing slash; "" mounts it at the root). The handler
	// expects the full request path, so mount it with
	// mux.Handle(prefix+"/", h), without http.StripPrefix.
	Prefix string
	// Authorize, when set, runs before every request (pages, actions and
	// static files). A non-nil error refuses the request: 401 when it wraps
	// ErrUnauthenticated, 403 otherwise. The error's text is neither shown
	// nor logged.
	Authorize func(*http.Request) error
	// Logger receives one line per action (what, how many) and per failed
	// request; never payloads, keys, streams or claim keys. Nil discards.
	Logger *slog.Logger
	// RefreshInterval is how often the overview refreshes itself in the
	// browser: 0 is DefaultRefreshInterval, negative turns the refresh off.
	RefreshInterval time.Duration
	// CSRFKey signs the CSRF tokens: at least 32 random bytes, shared by
	// every replica behind one address. Nil makes a random key for this
	// handler, which is right for a single process (a restart asks an open
	// page to reload before its next action).
	CSRFKey []byte
	// Hosts names the hosts the UI answers besides IP addresses: the
	// request's Host header without its port, compared without case
	// ("ops.example.com", or "*.example.com" for its subdomains); "*"
	// answers any. Empty: "localhost" and "*.localhost". A request for
	// another host gets 421 Misdirected Request, before Authorize runs. This refuses DNS rebinding: a page of
	// an attacker's domain that resolves to this server is same-origin to
	// the browser, which then sends it the UI's pages (and forms) from the
	// operator's own machine, past origin checks and an Authorize that
	// trusts the client's address; only the Host it names gives it away.
	Hosts []string
	// SecureCookie marks the CSRF cookie Secure on every response, for a
	// UI served over HTTPS by a proxy that terminates TLS and does not say
	// so. Without it the cookie is Secure when the request came over TLS
	// or a proxy says https in the first entry of X-Forwarded-Proto (or,
	// without that header, in the proto of Forwarded's first element): a
	// browser then never sends it over plain HTTP.
	SecureCookie bool
}

// Handler returns the admin UI over store.
func Handler(store *outbox.Store, opts Options) (http.Handler, error) {
	if store == nil {
		return nil, errors.New("admin: nil store")
	}
	prefix := strings.TrimSuffix(opts.Prefix, "/")
	if prefix != "" && (!strings.HasPrefix(prefix, "/") || strings.ContainsAny(prefix, "?#{} \"'<>\\")) {
		return nil, fmt.Errorf("admin: prefix %q must start with / and be a plain path", opts.Prefix)
	}
	key := opts.CSRFKey
	switch {
	case key == nil:
		key = make([]byte, 32)
		_, _ = rand.Read(key) // crypto/rand.Read never fails on supported platforms
	case len(key) < 32:
		return nil, fmt.Errorf("admin: CSRF key has %d bytes, want at least 32", len(key))
	default:
		key = append([]byte(nil), key...)
	}
	refresh := opts.RefreshInterval
	if refresh == 0 {
		refresh = DefaultRefreshInterval
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	hosts := map[string]bool{}
	for _, h := range opts.Hosts {
		h = strings.ToLower(strings.TrimSpace(h))
		if h != "*" {
			wild := strings.HasPrefix(h, "*.")
			name := strings.TrimSuffix(strings.TrimPrefix(h, "*."), ".")
			if name == "" || strings.ContainsAny(name, "*:/[]@ ") {
				return nil, fmt.Errorf("admin: host %q must be a host name without port, *.name or *", h)
			}
			if h = name; wild {
				h = "*." + name
			}
		}
		hosts[h] = true
	}
	if len(hosts) == 0 {
		hosts["localhost"], hosts["*.localhost"] = true, true
	}
	pages, err := parseTemplates()
	if err != nil {
		return nil, err
	}
	s := &server{
		store:     store,
		readOnly:  opts.ReadOnly,
		prefix:    prefix,
		authorize: opts.Authorize,
		log:       logger,
		refresh:   refresh,
		csrf:      csrfGuard{key: key, cookiePath: prefix + "/", secure: opts.SecureCookie},
		pages:     pages,
		origins:   http.NewCrossOriginProtection(),
		hosts:     hosts,
	}
	s.mux = s.routes()
	return s, nil
}

// server is the admin UI's handler.
type server struct {
	store     *outbox.Store
	readOnly  bool
	prefix    string
	authorize func(*http.Request) error
	log       *slog.Logger
	refresh   time.Duration
	csrf      csrfGuard
	pages     *templates
	origins   *http.CrossOriginProtection
	hosts     map[string]bool // names answered besides IP addresses (see Options.Hosts)
	mux       *http.ServeMux
}

// answers reports whether the UI serves requests for the Host header host:
// an IP address, or a name of Options.Hosts.
func (s *server) answers(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	switch {
	case host == "":
		return false
	case net.ParseIP(host) != nil, s.hosts["*"], s.hosts[host]:
		return true
	}
	for h := range s.hosts {
		if suffix, ok := strings.CutPrefix(h, "*"); ok && suffix != "" && strings.HasSuffix(host, suffix) {
			return true
		}
	}
	return false
}

func (s *server) routes() *http.ServeMux {
	m := http.NewServeMux()
	m.HandleFunc("GET /{$}", s.overview)
	m.HandleFunc("GET /dead", s.deadList)
	m.HandleFunc("POST /dead/confirm", s.deadConfirm)
	m.HandleFunc("POST /dead/apply", s.deadApply)
	m.HandleFunc("GET /events/{id}", s.eventDetail)
	m.HandleFunc("GET /lookup", s.lookup)
	m.HandleFunc("GET /groups", s.groups)
	m.HandleFunc("POST /groups/confirm", s.groupConfirm)
	m.HandleFunc("POST /groups/apply", s.groupApply)
	m.Handle("GET /static/", http.StripPrefix("/static/", staticHandler()))
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.fail(w, r, http.StatusNotFound, "There is no page at this address.")
	})
	return m
}

// ServeHTTP applies the security headers, Authorize and, for POST, the
// read-only, cross-origin and CSRF checks, then routes the request.
func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	setSecurityHeaders(w.Header())
	if !s.answers(r.Host) {
		s.log.Info("admin: request for a host the UI does not answer refused (see admin.Options.Hosts)", "method", r.Method)
		http.Error(w, "This admin UI does not answer for this host name (admin.Options.Hosts).", http.StatusMisdirectedRequest)
		return
	}
	if s.authorize != nil {
		if err := s.authorize(r); err != nil {
			status := http.StatusForbidden
			if errors.Is(err, ErrUnauthenticated) {
				status = http.StatusUnauthorized
			}
			s.log.Info("admin: request refused by Authorize", "method", r.Method, "status", status)
			http.Error(w, http.StatusText(status), status)
			return
		}
	}
	path := r.URL.Path
	if s.prefix != "" {
		if path == s.prefix {
			http.Redirect(w, r, s.prefix+"/", http.StatusMovedPermanently)
			return
		}
		rest, ok := strings.CutPrefix(path, s.prefix+"/")
		if !ok {
			http.NotFound(w, r)
			return
		}
		path = "/" + rest
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		if status, why := s.checkAction(w, r); status != 0 {
			s.log.Info("admin: action refused", "reason", why, "status", status)
			s.fail(w, r, status, why)
			return
		}
	}
	r2 := r.Clone(r.Context())
	r2.URL.Path, r2.URL.RawPath = path, ""
	s.mux.ServeHTTP(w, r2)
}

// maxFormBytes bounds an action's form: a selection of MaxBatch ids with
// their streams fits with room to spare.
const maxFormBytes = 1 << 20

// checkAction refuses a state-changing request unless actions are on, it
// comes from this origin and it carries a valid CSRF token. It returns 0
// when the request may proceed.
func (s *server) checkAction(w http.ResponseWriter, r *http.Request) (int, string) {
	if r.Method != http.MethodPost {
		return http.StatusMethodNotAllowed, "Only GET and POST requests are served."
	}
	if s.readOnly {
		return http.StatusForbidden, "This admin UI is read-only: actions are turned off."
	}
	if err := s.origins.Check(r); err != nil {
		return http.StatusForbidden, "Cross-origin requests are refused."
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		return http.StatusBadRequest, "The form could not be read."
	}
	if !s.csrf.valid(r) {
		return http.StatusForbidden, "The form's security token is missing or out of date. Reload the page and try again."
	}
	return 0, ""
}
