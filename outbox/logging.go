package outbox

import (
	"github.com/ThreeDotsLabs/watermill"

	"github.com/millpond/millpond/internal/panicstack"
)

// RedactedField is what RedactingLogger logs in place of a message UUID.
const RedactedField = "[redacted]"

// uuidField is the Watermill log field that holds a message UUID, added by
// the router (handler errors, acks, nacks) and its CQRS processors. A message
// of a Subscriber has the event key as its UUID.
const uuidField = "message_uuid"

// RedactingLogger wraps a Watermill logger so that the message UUIDs
// Watermill's router, CQRS processors and middleware add to their log lines
// ("message_uuid") are replaced by RedactedField, and the stack of a panic
// the router recovered is logged without its frames' argument values. A
// message of an outbox Subscriber carries the event key as its UUID, and
// event keys may hold customer data (an email address, an order number),
// which never belongs in logs. bus.New wraps its logger with it; wrap the logger of a Watermill
// router of your own that reads an outbox.Subscriber the same way:
//
//	router, err := message.NewRouter(message.RouterConfig{}, outbox.RedactingLogger(logger))
//
// A nil logger gives nil (the router then uses its no-op logger), and
// Watermill's no-op logger is returned as it is: it logs nothing, so there is
// nothing to redact, and a router's log calls per message then copy no
// fields.
func RedactingLogger(l watermill.LoggerAdapter) watermill.LoggerAdapter {
	switch l.(type) {
	case nil, redactingLogger, watermill.NopLogger, *watermill.NopLogger:
		return l
	}
	return redactingLogger{l}
}

type redactingLogger struct{ next watermill.LoggerAdapter }

// redact returns fields without the message UUID, copying only when it is
// there.
func redact(fields watermill.LogFields) watermill.LogFields {
	if _, ok := fields[uuidField]; !ok {
		return fields
	}
	out := fields.Copy()
	out[uuidField] = RedactedField
	return out
}

func (r redactingLogger) Error(msg string, err error, fields watermill.LogFields) {
	r.next.Error(panicstack.StripTraceback(msg), stripErrorStack(err), redact(fields))
}

// stripErrorStack hides the argument values of a goroutine traceback that
// err's text quotes: the router logs a handler's error, and a recovered
// panic's (Watermill's Recoverer middleware, "panic occurred: ...,
// stacktrace: goroutine 7 [running]: ...") holds a stack whose frames show
// the words of their arguments, fields of the event among them. The router
// also logs a panic it recovered itself with its stack in msg ("Panic
// recovered in handler. Stack: ..."). An err without a traceback is passed
// on as it is.
func stripErrorStack(err error) error {
	if err == nil {
		return nil
	}
	text := err.Error()
	stripped := panicstack.StripTraceback(text)
	if stripped == text {
		return err
	}
	return strippedError{text: stripped, err: err}
}

// strippedError is an error whose text had its traceback stripped. It
// formats as that text only (a logger that prints %+v or a stack of the
// error it is given sees nothing else) and unwraps to the original for
// errors.Is and errors.As.
type strippedError struct {
	text string
	err  error
}

func (e strippedError) Error() string { return e.text }
func (e strippedError) Unwrap() error { return e.err }

func (r redactingLogger) Info(msg string, fields watermill.LogFields) {
	r.next.Info(msg, redact(fields))
}

func (r redactingLogger) Debug(msg string, fields watermill.LogFields) {
	r.next.Debug(msg, redact(fields))
}

func (r redactingLogger) Trace(msg string, fields watermill.LogFields) {
	r.next.Trace(msg, redact(fields))
}

func (r redactingLogger) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return redactingLogger{r.next.With(redact(fields))}
}
