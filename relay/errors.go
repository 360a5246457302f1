package relay

import "errors"

// Errors returned by the relays; test them with errors.Is. Every error a
// relay returns wraps one of them (configuration checks at start) or a
// Store, NATS or Watermill error.
var (
	// ErrInvalidConfig reports a configuration value out of its bounds: no
	// stream, a bad consumer group, window, lease, retry delay or timeout,
	// or a NATS server URL that does not parse (Connect,
	// NewDeferredJetStream) or is missing (NewDeferredJetStream).
	ErrInvalidConfig = errors.New("relay: invalid configuration")
	// ErrInvalidSubjectTemplate reports a subject template or prefix that
	// cannot make valid NATS subjects, or a template that strict mode
	// cannot use (it needs {stream} and {ordering_key}).
	ErrInvalidSubjectTemplate = errors.New("relay: invalid subject template")
	// ErrUnreachable reports a NATS server that could not be reached, or a
	// connection that is not connected when the relay starts.
	ErrUnreachable = errors.New("relay: NATS server unreachable")
	// ErrNotOpened reports a relay of NewDeferredJetStream run before
	// its Open succeeded.
	ErrNotOpened = errors.New("relay: the relay is not open (call Open first)")
	// ErrClosed reports a relay of NewDeferredJetStream opened or run
	// after its Close.
	ErrClosed = errors.New("relay: the relay is closed")
	// ErrNoJetStream reports a NATS server (or account) without JetStream.
	ErrNoJetStream = errors.New("relay: JetStream not available")
	// ErrStreamNotFound reports that the JetStream stream named in the
	// configuration does not exist, or that no stream captures the relay's
	// subjects.
	ErrStreamNotFound = errors.New("relay: JetStream stream not found")
	// ErrSubjectNotCaptured reports that the relay's subjects are captured
	// by another JetStream stream than the configured one.
	ErrSubjectNotCaptured = errors.New("relay: subjects not captured by the JetStream stream")
	// ErrDuplicateWindowTooShort reports a JetStream stream whose duplicate
	// window (StreamConfig.Duplicates) is shorter than the relay needs to
	// drop its own re-publications (see Config.RequiredDuplicateWindow).
	ErrDuplicateWindowTooShort = errors.New("relay: JetStream duplicate window too short")
	// ErrStrictConflict reports, in strict mode, a subject whose last
	// message is neither this event nor an earlier event of its ordering
	// key: something else publishes to the relay's subjects. The event is
	// retried with backoff and dead-lettered at the attempt limit.
	ErrStrictConflict = errors.New("relay: strict mode conflict: the subject's last message is not from this ordering key")
	// ErrUnpublishable reports an event that can never be published as it
	// is (metadata that cannot be a NATS header, a payload above the
	// server's or the stream's limit); it is dead-lettered at once.
	ErrUnpublishable = errors.New("relay: event cannot be published")
)
