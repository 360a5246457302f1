package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/millpond/millpond/admin"
)

// defaultUIAddr keeps the admin UI on the loopback interface unless the
// operator asks for another address.
const defaultUIAddr = "127.0.0.1:8081"

const uiUsage = `Usage: millpond ui [-addr 127.0.0.1:8081] [-read-only] [-prefix /path] [-hosts names] [-secure-cookie] [-db URL]

Serve the admin web UI: the backlog per stream and consumer group, dead
letters with their details, event lookup, and requeue, reroute or discard
of dead letters and unregistering of groups after a confirmation (hidden
and refused with -read-only). It has no login: keep it
on a loopback address (the default) or behind an authenticating proxy.
It answers requests for IP addresses and for localhost only, unless -hosts
names the host names it is reached by (a name of an attacker's that
resolves to this machine would otherwise reach it from your browser).
Behind a proxy that serves it over HTTPS without saying so in
X-Forwarded-Proto or Forwarded, -secure-cookie marks its CSRF cookie
Secure. Stop it with Ctrl-C.
`

func cmdUI(e *env, args []string) error {
	fs := newFlagSet(e, "ui", uiUsage)
	addr := fs.String("addr", defaultUIAddr, "listen address")
	readOnly := fs.Bool("read-only", false, "hide and refuse every action (requeue, reroute, discard, unregister)")
	prefix := fs.String("prefix", "", "path prefix to serve under, such as /admin (default: the root)")
	hostList := fs.String("hosts", "", "comma-separated host names the UI answers besides IP addresses, such as ops.example.com or *.example.com (default: localhost)")
	secureCookie := fs.Bool("secure-cookie", false, "mark the CSRF cookie Secure on every response (a TLS-terminating proxy in front that sets no X-Forwarded-Proto)")
	dbFlag := addDBFlag(fs)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("ui: unexpected argument %q", pos[0])
	}
	// Without the schema every page would be a 500: say so now.
	s, db, err := openInstalled(e, *dbFlag)
	if err != nil {
		return err
	}
	defer s.Close()
	logger := slog.New(slog.NewTextHandler(e.stderr, nil))
	var hosts []string
	if *hostList != "" {
		hosts = strings.Split(*hostList, ",")
	}
	h, err := admin.Handler(s, admin.Options{ReadOnly: *readOnly, Prefix: *prefix, Logger: logger, Hosts: hosts, SecureCookie: *secureCookie})
	if err != nil {
		return usagef("ui: %v", err)
	}
	base := strings.TrimSuffix(*prefix, "/")
	mux := http.NewServeMux()
	mux.Handle(base+"/", h)
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("ui: listen on %s: %w", *addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}
	mode := "read-write"
	if *readOnly {
		mode = "read-only"
	}
	fmt.Fprintf(e.stdout, "admin UI (%s) for %s at http://%s%s/\n", mode, db.shown, ln.Addr(), base)
	if tcp, ok := ln.Addr().(*net.TCPAddr); ok && !tcp.IP.IsLoopback() {
		fmt.Fprintf(e.stderr, "warning: %s is not a loopback address and the admin UI has no login: "+
			"anyone who reaches it can read events' payloads (and, without -read-only, requeue dead letters)\n", ln.Addr())
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("ui: %w", err)
	case <-e.ctx.Done():
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("ui: shut down: %w", err)
	}
	return nil
}
