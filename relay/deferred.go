package relay

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/millpond/millpond/outbox"
)

// deferredConn is how a NewDeferredJetStream relay connects, and the
// connection its Open made.
type deferredConn struct {
	servers string
	opts    []nats.Option

	// openMu serialises Open, so that two calls never both connect; it is
	// held across the network round trips, mu is not.
	openMu sync.Mutex
	// mu guards the fields below, and the relay's js, stream, cfg.Stream
	// and window, which Open sets.
	mu sync.Mutex
	// nc is the connection of an Open that connected (still checking the
	// stream until opened), which Close closes.
	nc     *nats.Conn
	opened bool
	closed bool
}

// NewDeferredJetStream returns a JetStream relay that has not connected
// yet: it checks what needs no server (the configuration, the subject
// template, the NATS server URLs: ErrInvalidConfig,
// ErrInvalidSubjectTemplate) and holds no connection and runs no goroutine
// until Open connects to servers (a comma-separated list, as for Connect,
// with opts after the relay's own) and checks the stream, as NewJetStream
// does. It is for wiring frameworks whose constructors run before the
// application starts and may never be followed by a start or a stop
// (package fxmodule: an fx.New that fails after its constructors ran runs
// no hook, so a connection made there would never be closed).
//
// Until Open succeeded, Stats, StreamName (the configured
// JetStreamConfig.Stream, empty when the stream is found by subject),
// DuplicateWindow (0), RegisterGroups (which needs only the store) and
// Close work; Run fails with ErrNotOpened. The relay owns the connection
// Open made: Close closes it, once Run returned. No error shows a
// credential of servers.
func NewDeferredJetStream(store *outbox.Store, servers string, cfg JetStreamConfig, opts ...nats.Option) (*JetStream, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: nil store", ErrInvalidConfig)
	}
	if strings.TrimSpace(servers) == "" {
		return nil, fmt.Errorf("%w: no NATS server URL", ErrInvalidConfig)
	}
	if err := checkServerURLs(servers); err != nil {
		return nil, err
	}
	r, err := newJetStream(store, cfg)
	if err != nil {
		return nil, err
	}
	r.deferred = &deferredConn{servers: servers, opts: opts}
	return r, nil
}

// Open connects a relay made by NewDeferredJetStream and checks the
// stream against the server, as NewJetStream does: it fails with
// ErrInvalidConfig, ErrUnreachable (no server answers; the URLs redacted),
// ErrNoJetStream, ErrStreamNotFound, ErrSubjectNotCaptured or
// ErrDuplicateWindowTooShort, and then holds nothing (the connection it
// made is closed): a later call tries again. Once it succeeded it does
// nothing; after Close it fails with ErrClosed. ctx bounds the stream's
// checks; the connection itself gives up after Connect's timeout. It does
// nothing for a relay made by NewJetStream. Calls are serialised.
func (r *JetStream) Open(ctx context.Context) error {
	d := r.deferred
	if d == nil {
		return nil
	}
	d.openMu.Lock()
	defer d.openMu.Unlock()
	d.mu.Lock()
	opened, closed := d.opened, d.closed
	d.mu.Unlock()
	switch {
	case closed && opened:
		return ErrClosed
	case closed:
		return fmt.Errorf("%w (before it opened)", ErrClosed)
	case opened:
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("relay: open: %w", err)
	}
	nc, err := Connect(d.servers, d.opts...)
	if err != nil {
		return err
	}
	// From here on a Close closes nc, which ends the stream's checks at
	// once rather than when ctx ends (a server that does not answer
	// JetStream's API holds them up to 10 s).
	d.mu.Lock()
	if d.closed { // Close ran while this connected
		d.mu.Unlock()
		nc.Close()
		return fmt.Errorf("%w (while it opened)", ErrClosed)
	}
	d.nc = nc
	d.mu.Unlock()
	js, stream, err := r.connectStream(ctx, nc)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed { // Close ran while this checked the stream, and closed nc
		return fmt.Errorf("%w (while it opened)", ErrClosed)
	}
	if err != nil {
		d.nc = nil
		nc.Close()
		return err
	}
	r.js, r.stream = js, stream
	r.cfg.Stream, r.window = streamInfo(stream)
	d.opened = true
	return nil
}

// Close closes the NATS connection Open made, for a relay made by
// NewDeferredJetStream; call it once Run returned (Run waits for the
// publishes in flight, which need the connection). Before Open it makes
// the relay unusable: a later Open or Run fails with ErrClosed; an Open
// under way that has connected is ended (its connection closed) and
// fails with ErrClosed. It may be
// called more than once, and always returns nil. It does nothing for a
// relay made by NewJetStream, whose connection is its caller's.
func (r *JetStream) Close() error {
	d := r.deferred
	if d == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	if d.nc != nil {
		d.nc.Close()
		d.nc = nil
	}
	return nil
}

// checkOpened returns ErrNotOpened or ErrClosed for a relay of
// NewDeferredJetStream that Open did not open or Close closed, and nil
// otherwise; it orders what Open wrote before the caller's reads.
func (r *JetStream) checkOpened() error {
	d := r.deferred
	if d == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case d.closed:
		return ErrClosed
	case !d.opened:
		return ErrNotOpened
	}
	return nil
}
