package outbox_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/millpond/millpond/outbox"
)

// TestNoFormatVerbPrintsSecrets: String, GoString, LogValue and MarshalJSON
// redact the stream, keys, claim key and payload, but a verb that skips
// String (%d, %x, %s of a struct's fields) printed the fields one by one.
// Every verb now prints the redacted description.
func TestNoFormatVerbPrintsSecrets(t *testing.T) {
	const s = "SECRET"
	values := map[string]any{
		"Event": outbox.Event{Stream: "stream" + s, Key: "key" + s, Kind: "K", Payload: []byte("payload" + s),
			OrderingKey: "okey" + s, Metadata: map[string]string{"m": "meta" + s}},
		"Receipt":     outbox.Receipt{ID: 7, ClaimKey: "claim" + s},
		"Claimed":     outbox.Claimed{ID: 7, Stream: "stream" + s, Key: "key" + s, Kind: "K", Payload: []byte("payload" + s), ClaimKey: "claim" + s, OrderingKey: "okey" + s, CreatedAt: time.Now()},
		"DeadEvent":   outbox.DeadEvent{ID: 7, Stream: "stream" + s, Group: "group" + s, Key: "key" + s, Kind: "K"},
		"EventRecord": outbox.EventRecord{ID: 7, Stream: "stream" + s, Group: "group" + s, Key: "key" + s, Kind: "K", Payload: []byte("payload" + s)},
	}
	for name, v := range values {
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%d", "%x", "%X", "%q", "%o", "%t", "%10.4v", "%-8s"} {
			for _, arg := range []any{v, []any{v}, map[string]any{"v": v}} {
				if out := fmt.Sprintf(verb, arg); strings.Contains(out, s) || strings.Contains(strings.ToUpper(out), fmt.Sprintf("%X", s)) {
					t.Errorf("%s with %s shows a secret: %s", name, verb, out)
				}
			}
		}
		if out := fmt.Sprintf("%q", v); !strings.HasPrefix(out, `"`+name+"{") {
			t.Errorf("%s with %%q: %s, want its quoted description", name, out)
		}
	}
}

// TestFormatKeepsWidthAndPrecision: Format replaced the padding and
// truncation that fmt applies to String's result: %-30v of a Receipt in a
// table row lost its column, as %.10v its cut.
func TestFormatKeepsWidthAndPrecision(t *testing.T) {
	r := outbox.Receipt{ID: 7, ClaimKey: "claim"}
	s := r.String()
	for verb, want := range map[string]string{
		"%-60v|": fmt.Sprintf("%-60s|", s),
		"%60v|":  fmt.Sprintf("%60s|", s),
		"%.7v|":  fmt.Sprintf("%.7s|", s),
		"%-60q|": fmt.Sprintf("%-60q|", s),
	} {
		if got := fmt.Sprintf(verb, r); got != want {
			t.Errorf("%s: %q, want %q", verb, got, want)
		}
	}
}
