package relay

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/millpond/millpond/outbox"
)

// Headers the JetStream relay sets on every message, besides Nats-Msg-Id
// (jetstream.MsgIDHeader) and the event's metadata.
const (
	// HeaderStream is the event's outbox stream.
	HeaderStream = "Millpond-Stream"
	// HeaderKind is the event's kind.
	HeaderKind = "Millpond-Kind"
	// HeaderKey is the event's idempotency key.
	HeaderKey = "Millpond-Key"
	// HeaderOrderingKey is the event's ordering key (absent when none).
	HeaderOrderingKey = "Millpond-Ordering-Key"
	// HeaderOrderingSeq is the event's position among the events of its
	// ordering key, from 1 (absent when unordered).
	HeaderOrderingSeq = "Millpond-Ordering-Seq"
)

// JetStreamConfig configures a JetStream relay.
type JetStreamConfig struct {
	Config
	// Stream is the JetStream stream the subjects belong to. Empty: the
	// stream that captures the relay's subjects (js.StreamNameBySubject).
	// Either way New checks that the stream exists and captures them.
	Stream string
	// SubjectPrefix fills {prefix} (default DefaultSubjectPrefix): one or
	// more literal tokens.
	SubjectPrefix string
	// SubjectTemplate builds each message's subject; empty means
	// DefaultSubjectTemplate, or OrderingKeySubjectTemplate with
	// OrderingKeyInSubject or Strict. Tokens are literals or placeholders
	// ({prefix}, {stream}, {kind}, {key}, {ordering_key}); an invalid
	// template fails New with ErrInvalidSubjectTemplate.
	SubjectTemplate string
	// OrderingKeyInSubject appends the ordering key to the default
	// template (ignored when SubjectTemplate is set).
	OrderingKeyInSubject bool
	// Strict publishes with an expected last sequence per subject instead
	// of relying on the stream's duplicate window; see the package
	// documentation for its constraints. A strict relay claims under
	// leases (Config.UseLeases): one publish may take several publish
	// timeouts, longer than a held batch may stay open.
	Strict bool
}

// DefaultJetStreamWindow is the JetStream relay's default Config.Window
// (other relays default to DefaultWindow): JetStream confirms asynchronous
// publishes in bulk, and in the relay bench (PostgreSQL, held claims) the
// relay delivered about 1.5 times as much with a window of 1000 as with
// 256 (a bare publish loop about 1.1 times): a held batch holds at most a
// window of events.
const DefaultJetStreamWindow = outbox.MaxBatch

// setJetStreamDefaults is Config.setDefaults with the JetStream relay's
// default window.
func (c *JetStreamConfig) setJetStreamDefaults() {
	if c.Window == 0 {
		c.Window = DefaultJetStreamWindow
	}
	c.setDefaults()
}

// JetStream relays outbox events to a NATS JetStream stream. Create it with
// NewJetStream (or NewDeferredJetStream and Open) and run it with Run.
type JetStream struct {
	// deferred is how a relay of NewDeferredJetStream connects, and what
	// it opened; nil for NewJetStream's.
	deferred *deferredConn

	cfg    JetStreamConfig
	js     jetstream.JetStream
	stream jetstream.Stream
	tmpl   subjectTemplate
	run    *runner
	stats  counters
	window time.Duration // the stream's duplicate window

	mu   sync.Mutex
	last map[string]uint64 // strict mode: last known sequence per subject

	// unconfirmed holds the asynchronous publishes outside strict mode,
	// by message, until the publisher's acknowledgement or error handler
	// (onPubAck, onPubErr) takes them out and finishes them.
	unconfirmedMu sync.Mutex
	unconfirmed   map[*nats.Msg]unconfirmedPub

	// msgs holds messages of confirmed publishes, for natsMsg to reuse
	// (see recycle).
	msgs sync.Pool

	// subjects caches the subject of each stream and kind when the
	// template uses neither {key} nor {ordering_key} (see subject).
	subjectsMu sync.Mutex
	subjects   map[streamKind]string
}

type streamKind struct{ stream, kind string }

// subjectCacheSize bounds the subject cache; a full cache starts over.
const subjectCacheSize = 1 << 12

// unconfirmedPub is an asynchronous publish waiting for its outcome.
type unconfirmedPub struct {
	p  *pipeline
	it *item
}

// lastCacheSize bounds the strict mode's per-subject cache; a subject
// forgotten costs one extra round trip the next time.
const lastCacheSize = 1 << 16

// NewJetStream checks the configuration against the server and returns a
// relay. It fails with ErrInvalidConfig, ErrInvalidSubjectTemplate,
// ErrUnreachable (nc is not connected), ErrNoJetStream, ErrStreamNotFound,
// ErrSubjectNotCaptured or ErrDuplicateWindowTooShort. The relay owns
// nothing: closing nc and the store is the caller's job, after Run returned.
// (NewDeferredJetStream makes a relay that connects when it is opened, and
// owns that connection.)
func NewJetStream(ctx context.Context, store *outbox.Store, nc *nats.Conn, cfg JetStreamConfig) (*JetStream, error) {
	if store == nil || nc == nil {
		return nil, fmt.Errorf("%w: nil store or NATS connection", ErrInvalidConfig)
	}
	r, err := newJetStream(store, cfg)
	if err != nil {
		return nil, err
	}
	js, stream, err := r.connectStream(ctx, nc)
	if err != nil {
		return nil, err
	}
	r.js, r.stream = js, stream
	r.cfg.Stream, r.window = streamInfo(stream)
	return r, nil
}

// newJetStream checks what can be checked without the server (the
// configuration, the subject template) and returns a relay that has no
// JetStream context yet.
func newJetStream(store *outbox.Store, cfg JetStreamConfig) (*JetStream, error) {
	cfg.setJetStreamDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if store.Dialect() != "postgres" || cfg.Strict {
		// The relay holds claims on PostgreSQL only; strict mode's publishes may each
		// take several publish timeouts (a read of the subject's last
		// message, a publish again), beyond a held batch's idle bound.
		cfg.UseLeases = true
	}
	if cfg.SubjectPrefix == "" {
		cfg.SubjectPrefix = DefaultSubjectPrefix
	}
	if cfg.SubjectTemplate == "" {
		cfg.SubjectTemplate = DefaultSubjectTemplate
		if cfg.OrderingKeyInSubject || cfg.Strict {
			cfg.SubjectTemplate = OrderingKeySubjectTemplate
		}
	}
	tmpl, err := parseTemplate(cfg.SubjectTemplate, cfg.SubjectPrefix)
	if err != nil {
		return nil, err
	}
	if cfg.Strict {
		if !tmpl.has[PlaceholderStream] || !tmpl.has[PlaceholderOrderingKey] {
			return nil, fmt.Errorf("%w: %q: strict mode needs a subject per ordering key: the template must hold %s and %s",
				ErrInvalidSubjectTemplate, cfg.SubjectTemplate, PlaceholderStream, PlaceholderOrderingKey)
		}
		if cfg.DeadLetterPolicy != outbox.DeadLetterHold {
			return nil, fmt.Errorf("%w: strict mode needs the dead-letter policy hold (a skipped event requeued later would be published after its successors)", ErrInvalidConfig)
		}
	}
	r := &JetStream{cfg: cfg, tmpl: tmpl, last: map[string]uint64{}, unconfirmed: map[*nats.Msg]unconfirmedPub{},
		subjects: map[streamKind]string{}}
	// The runner reads the stream's name once Run started, after the
	// relay was opened (NewJetStream, Open): no lock.
	r.run, err = newRunner(store, cfg.Config, &r.stats, func(string) string { return r.cfg.Stream }, r.send)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// connectStream makes the relay's JetStream context on nc and checks the
// stream against the server (checkStream). It writes nothing into r.
func (r *JetStream) connectStream(ctx context.Context, nc *nats.Conn) (jetstream.JetStream, jetstream.Stream, error) {
	if !nc.IsConnected() {
		return nil, nil, fmt.Errorf("%w: the connection is %s", ErrUnreachable, strings.ToLower(nc.Status().String()))
	}
	// The outcomes of asynchronous publishes come to the handlers, on the
	// client's goroutines: no goroutine of the relay wakes up for each.
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(r.cfg.Window*len(r.cfg.Streams)+16),
		jetstream.WithPublishAsyncTimeout(r.cfg.PublishTimeout),
		jetstream.WithPublishAsyncAckHandler(r.onPubAck),
		jetstream.WithPublishAsyncErrHandler(r.onPubErr))
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrNoJetStream, err)
	}
	stream, err := r.checkStream(ctx, js)
	if err != nil {
		return nil, nil, err
	}
	return js, stream, nil
}

// streamInfo is the name and the duplicate window of a stream checkStream
// returned.
func streamInfo(s jetstream.Stream) (string, time.Duration) {
	c := s.CachedInfo().Config
	return c.Name, c.Duplicates
}

// checkStream finds the stream, checks that it captures every stream's
// subjects and, outside strict mode, that its duplicate window is long
// enough, and returns it. It writes nothing into r.
func (r *JetStream) checkStream(ctx context.Context, js jetstream.JetStream) (jetstream.Stream, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := js.AccountInfo(ctx); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoJetStream, err)
	}
	name := r.cfg.Stream
	for _, s := range r.cfg.Streams {
		probe := r.tmpl.subject(s, "probe", "probe", "probe")
		found, err := js.StreamNameBySubject(ctx, probe)
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound) && name == "":
			return nil, fmt.Errorf("%w: no JetStream stream captures the subjects of template %q (such as %q); create one", ErrStreamNotFound, r.cfg.SubjectTemplate, r.tmpl.subject("<stream>", "<kind>", "<key>", "<ordering-key>"))
		case errors.Is(err, jetstream.ErrStreamNotFound):
			found = ""
		case err != nil:
			return nil, fmt.Errorf("relay: look up the JetStream stream: %w", err)
		}
		if name == "" {
			name = found
		}
		if found != name {
			if _, err := js.Stream(ctx, name); errors.Is(err, jetstream.ErrStreamNotFound) {
				return nil, fmt.Errorf("%w: %q does not exist", ErrStreamNotFound, name)
			}
			return nil, fmt.Errorf("%w: subjects of template %q go to stream %q, not %q", ErrSubjectNotCaptured, r.cfg.SubjectTemplate, found, name)
		}
	}
	stream, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("%w: %q does not exist", ErrStreamNotFound, name)
	}
	if err != nil {
		return nil, fmt.Errorf("relay: read JetStream stream %q: %w", name, err)
	}
	window := stream.CachedInfo().Config.Duplicates
	if need := r.cfg.RequiredDuplicateWindow(); !r.cfg.Strict && window < need {
		hold, what := r.cfg.Lease, "lease"
		if !r.cfg.UseLeases {
			hold, what = r.cfg.heldIdle(), "held batch's limit: the longer of the lease and four publish timeouts"
		}
		return nil, fmt.Errorf("%w: stream %q drops repeated message ids for %s, the relay needs at least %s (%s %s + longest retry delay %s + publish timeout %s): raise the stream's Duplicates, shorten those, or use strict mode",
			ErrDuplicateWindowTooShort, name, window, need, what, hold, r.cfg.MaxBackoff, r.cfg.PublishTimeout)
	}
	return stream, nil
}

// StreamName is the JetStream stream the relay publishes to. Before a
// relay of NewDeferredJetStream opened it is the configured
// JetStreamConfig.Stream (empty when the stream is found by subject).
func (r *JetStream) StreamName() string {
	if d := r.deferred; d != nil {
		d.mu.Lock()
		defer d.mu.Unlock()
	}
	return r.cfg.Stream
}

// DuplicateWindow is the stream's duplicate window, read at start (by
// NewJetStream, or Open); 0 before a relay of NewDeferredJetStream opened.
func (r *JetStream) DuplicateWindow() time.Duration {
	if d := r.deferred; d != nil {
		d.mu.Lock()
		defer d.mu.Unlock()
	}
	return r.window
}

// Stats counts what the relay did since it started.
func (r *JetStream) Stats() Stats { return r.stats.snapshot() }

// RegisterGroups checks the schema and registers the relay's consumer
// group for every stream, as Run does when it starts. Call it before
// producers start when Run starts in the background: events enqueued
// before the group is registered are not relayed. It needs only the
// store: a relay of NewDeferredJetStream need not be opened.
func (r *JetStream) RegisterGroups(ctx context.Context) error { return r.run.register(ctx) }

// Run relays until ctx ends, then stops gracefully: no more claims;
// publishes in flight are confirmed and acknowledged, for at most
// CloseTimeout (unconfirmed events are retried later, and dropped as
// duplicates if they had arrived). It may be called once. A relay of
// NewDeferredJetStream must be opened first (ErrNotOpened; ErrClosed
// after Close).
func (r *JetStream) Run(ctx context.Context) error {
	if err := r.checkOpened(); err != nil {
		return err
	}
	r.cfg.Logger.Info("relay started", "jetstream_stream", r.cfg.Stream, "outbox_streams", len(r.cfg.Streams),
		"group", r.cfg.Group, "strict", r.cfg.Strict, "window", r.cfg.Window, "duplicate_window", r.window.String())
	err := r.run.run(ctx)
	s := r.Stats()
	r.cfg.Logger.Info("relay stopped", "published", s.Published, "duplicates", s.Duplicates, "failed", s.Failed,
		"dead_lettered", s.DeadLettered, "conflicts", s.Conflicts)
	return err
}

// natsMsg builds the message of one event: subject, headers, payload.
// Outside strict mode the message of a confirmed publish comes back for
// reuse (see recycle): its header map then already holds the relay's own
// headers, whose one-value slices are overwritten in place, so a message
// usually costs the relay one allocation (its message id), not a message,
// a map and its values each time.
func (r *JetStream) natsMsg(c *outbox.Claimed) (*nats.Msg, error) {
	m, _ := r.msgs.Get().(*nats.Msg)
	if m == nil {
		m = &nats.Msg{Header: make(nats.Header, 6)}
	}
	h := m.Header
	for k, v := range c.Metadata {
		if !isUserMetadata(c, k, v) {
			continue
		}
		if err := checkHeader(k, v); err != nil {
			return nil, err
		}
		h.Set(k, v)
	}
	setHeader(h, jetstream.MsgIDHeader, MsgID(c.Stream, c.Key))
	setHeader(h, HeaderStream, c.Stream)
	setHeader(h, HeaderKind, c.Kind)
	setHeader(h, HeaderKey, c.Key)
	if c.OrderingKey != "" {
		setHeader(h, HeaderOrderingKey, c.OrderingKey)
		setHeader(h, HeaderOrderingSeq, strconv.FormatInt(c.OrderingSeq, 10))
	} else if _, ok := h[HeaderOrderingKey]; ok { // a reused message's
		delete(h, HeaderOrderingKey)
		delete(h, HeaderOrderingSeq)
	}
	m.Subject, m.Data = r.subject(c), c.Payload
	return m, nil
}

// ownHeaders is how many headers the relay sets on an event without an
// ordering key (two more with one).
const ownHeaders = 4

// setHeader sets header k to the single value v, in place when it has one
// value already.
func setHeader(h nats.Header, k, v string) {
	if vs := h[k]; len(vs) == 1 {
		vs[0] = v
		return
	}
	h[k] = []string{v}
}

// recycle keeps the message of a confirmed publish for natsMsg. The
// publisher is done with it: it wrote the message (headers included)
// before the PubAck could come, and dropped its pending entry before
// calling onPubAck, so neither a retry nor a timeout can use it again. A
// message that had headers besides the relay's own (metadata) is emptied,
// so none carries over to another event; natsMsg drops the ordering
// headers of a reused message for an event without an ordering key.
func (r *JetStream) recycle(m *nats.Msg) {
	h := m.Header
	own := ownHeaders
	if _, ok := h[HeaderOrderingKey]; ok {
		own += 2
	}
	if len(h) != own {
		clear(h)
	}
	*m = nats.Msg{Header: h}
	r.msgs.Put(m)
}

// subject is the subject of an event. Templates without {key} and
// {ordering_key} give every event of a stream and kind the same subject:
// it is built once and cached.
func (r *JetStream) subject(c *outbox.Claimed) string {
	if r.tmpl.perEvent {
		return r.tmpl.subject(c.Stream, c.Kind, c.Key, c.OrderingKey)
	}
	k := streamKind{c.Stream, c.Kind}
	r.subjectsMu.Lock()
	defer r.subjectsMu.Unlock()
	s, ok := r.subjects[k]
	if !ok {
		if len(r.subjects) >= subjectCacheSize {
			clear(r.subjects)
		}
		s = r.tmpl.subject(c.Stream, c.Kind, "", "")
		r.subjects[k] = s
	}
	return s
}

// checkHeader refuses metadata that cannot be a NATS header or would steer
// the server (Nats-*) or mask the relay's own headers (Millpond-*).
func checkHeader(k, v string) error {
	lower := strings.ToLower(k)
	if strings.HasPrefix(lower, "nats-") || strings.HasPrefix(lower, "millpond-") {
		return fmt.Errorf("%w: metadata key with the reserved prefix Nats- or Millpond-", ErrUnpublishable)
	}
	// nats.go takes printable ASCII but for these in a header key
	// (ErrBadHeaderMsg on every publish otherwise).
	for _, c := range []byte(k) {
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"()/,:;<=>?@[\]{}`, c) >= 0 {
			return fmt.Errorf("%w: metadata key with a space, control, non-ASCII character or one of \"()/,:;<=>?@[\\]{}", ErrUnpublishable)
		}
	}
	if strings.ContainsAny(v, "\r\n") {
		return fmt.Errorf("%w: metadata value with a line break", ErrUnpublishable)
	}
	return nil
}

// send publishes one event. Outside strict mode the publish is
// asynchronous and its PubAck (or error: a timeout after PublishTimeout, a
// lost connection) comes to onPubAck or onPubErr, so a whole window of
// publishes shares the connection's writes; a strict-mode publish may need
// a read of the subject and a second publish, so it runs on a goroutine of
// its own. A PubAck marked duplicate is a success.
func (r *JetStream) send(p *pipeline, it *item) {
	m, err := r.natsMsg(it.c)
	if err != nil {
		p.finish(it, result{err: err, dead: true, reason: ReasonUnpublishable})
		return
	}
	if r.cfg.Strict {
		go func() {
			dup, err := r.publishStrict(m, it.c)
			if err != nil && !errors.Is(err, ErrStrictConflict) {
				err = fmt.Errorf("publish to JetStream: %w", err)
			}
			p.finish(it, result{dup: dup, err: err})
		}()
		return
	}
	r.unconfirmedMu.Lock()
	r.unconfirmed[m] = unconfirmedPub{p: p, it: it}
	r.unconfirmedMu.Unlock()
	if _, err := r.js.PublishMsgAsync(m); err != nil {
		// Unless a handler took it meanwhile (the connection was lost
		// while the publish was being registered), it is finished here.
		if p, it, ok := r.confirmed(m); ok {
			p.finish(it, result{err: fmt.Errorf("publish to JetStream: %w", err)})
		}
	}
}

// confirmed takes the publish of m out of the unconfirmed ones; ok is false
// when it is not there (a strict-mode publish, or one already finished).
func (r *JetStream) confirmed(m *nats.Msg) (*pipeline, *item, bool) {
	r.unconfirmedMu.Lock()
	u, ok := r.unconfirmed[m]
	if ok {
		delete(r.unconfirmed, m)
	}
	r.unconfirmedMu.Unlock()
	return u.p, u.it, ok
}

// onPubAck is the publisher's acknowledgement handler: the message is in
// the stream (or was already, a duplicate).
func (r *JetStream) onPubAck(_ jetstream.JetStream, m *nats.Msg, ack *jetstream.PubAck) {
	if p, it, ok := r.confirmed(m); ok {
		r.recycle(m)
		p.finish(it, result{dup: ack.Duplicate})
	}
}

// onPubErr is the publisher's error handler: the publish failed, timed out
// or lost its connection. It may run with the publisher's lock held, so it
// must not call the publisher.
func (r *JetStream) onPubErr(_ jetstream.JetStream, m *nats.Msg, err error) {
	if p, it, ok := r.confirmed(m); ok {
		p.finish(it, result{err: fmt.Errorf("publish to JetStream: %w", err)})
	}
}

// publishAsync publishes through the asynchronous publisher (so publishes
// of many keys share the connection's writes) and waits for the outcome.
func (r *JetStream) publishAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	// Headers set by a previous try (the expected sequence) are replaced.
	f, err := r.js.PublishMsgAsync(m, opts...)
	if err != nil {
		return nil, err
	}
	select {
	case ack := <-f.Ok():
		return ack, nil
	case err := <-f.Err():
		return nil, err
	}
}

// publishStrict publishes with the subject's expected last sequence and
// resolves a mismatch by reading the subject's last message.
func (r *JetStream) publishStrict(m *nats.Msg, ev *outbox.Claimed) (bool, error) {
	id := m.Header.Get(jetstream.MsgIDHeader)
	expected := r.lastSeq(m.Subject)
	for range 3 {
		ack, err := r.publishAsync(m, jetstream.WithExpectLastSequencePerSubject(expected))
		if err == nil {
			r.setLastSeq(m.Subject, ack.Sequence)
			return ack.Duplicate, nil
		}
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) || (apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence &&
			apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
			return false, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), r.cfg.PublishTimeout)
		last, err := r.stream.GetLastMsgForSubject(ctx, m.Subject)
		cancel()
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			expected = 0 // the subject was purged
			continue
		case err != nil:
			return false, fmt.Errorf("read the subject's last message: %w", err)
		}
		// This event, when the message carries its key and its place in
		// its key's sequence: a later event under the same key (enqueued
		// again after a Purge) has another place, and goes after it.
		if last.Header.Get(jetstream.MsgIDHeader) == id && last.Header.Get(HeaderOrderingSeq) == m.Header.Get(HeaderOrderingSeq) {
			r.setLastSeq(m.Subject, last.Sequence)
			return true, nil // already published
		}
		if ev.OrderingKey == "" || last.Header.Get(HeaderStream) != ev.Stream || last.Header.Get(HeaderOrderingKey) != ev.OrderingKey {
			return false, ErrStrictConflict
		}
		if seq, _ := strconv.ParseInt(last.Header.Get(HeaderOrderingSeq), 10, 64); seq >= ev.OrderingSeq {
			return false, fmt.Errorf("%w (a later event of the key is already there)", ErrStrictConflict)
		}
		// An earlier event of this key, published by another relay of
		// the group or before a restart: publish after it.
		expected = last.Sequence
		r.setLastSeq(m.Subject, expected)
	}
	return false, fmt.Errorf("%w (the subject kept moving)", ErrStrictConflict)
}

func (r *JetStream) lastSeq(subject string) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last[subject] // 0 when unknown: a mismatch reads the real one
}

func (r *JetStream) setLastSeq(subject string, seq uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.last[subject]; !ok && len(r.last) >= lastCacheSize {
		clear(r.last)
	}
	r.last[subject] = seq
}
