package outbox_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millpond/millpond/outbox"
)

// RedactingLogger replaces the message UUID (an event key) in every line,
// wraps once, and hands back what logs nothing as it is.
func TestRedactingLogger(t *testing.T) {
	if outbox.RedactingLogger(nil) != nil {
		t.Error("a nil logger must stay nil (the router then uses its no-op logger)")
	}
	nop := watermill.NopLogger{}
	if got := outbox.RedactingLogger(nop); got != watermill.LoggerAdapter(nop) {
		t.Errorf("the no-op logger was wrapped: %T", got)
	}
	capture := watermill.NewCaptureLogger()
	l := outbox.RedactingLogger(capture)
	if again := outbox.RedactingLogger(l); again != l {
		t.Error("a redacting logger was wrapped twice")
	}
	l.With(watermill.LogFields{"message_uuid": "customer@example.com"}).Info("acked", nil)
	l.Error("failed", nil, watermill.LogFields{"message_uuid": "customer@example.com", "topic": "orders"})
	for _, level := range []watermill.LogLevel{watermill.InfoLogLevel, watermill.ErrorLogLevel} {
		for _, line := range capture.Captured()[level] {
			if got := line.Fields["message_uuid"]; got != outbox.RedactedField {
				t.Errorf("%q logged message_uuid %v, want %s", line.Msg, got, outbox.RedactedField)
			}
		}
	}
	if n := len(capture.Captured()[watermill.InfoLogLevel]) + len(capture.Captured()[watermill.ErrorLogLevel]); n != 2 {
		t.Fatalf("captured %d lines, want 2", n)
	}
}
