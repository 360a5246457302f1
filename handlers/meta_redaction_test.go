package handlers_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/millpond/millpond/handlers"
	"github.com/millpond/millpond/outbox"
)

// TestMetaAndEventQueryNeverPrintSecrets: a handler's Meta holds the event
// key, the ordering key and the metadata, and an outbox.EventQuery an
// event key; printed (fmt, any verb), logged (log/slog) or marshalled as
// JSON they showed them. They now show a redacted description, as Event
// and Claimed do.
func TestMetaAndEventQueryNeverPrintSecrets(t *testing.T) {
	const s = "SECRET"
	values := map[string]any{
		"Meta": handlers.Meta{Key: "key" + s, Kind: "OrderPlaced", Attempt: 2, EventID: 42,
			Metadata: map[string]string{"token": "meta" + s}, OrderingKey: "okey" + s, OrderingSeq: 3},
		"EventQuery": outbox.EventQuery{Stream: "orders", Key: "key" + s},
	}
	for name, v := range values {
		var outputs []string
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%d", "%x", "%q", "%10.4v"} {
			for _, arg := range []any{v, []any{v}, map[string]any{"v": v}} {
				outputs = append(outputs, fmt.Sprintf(verb, arg))
			}
		}
		for _, h := range []func(*bytes.Buffer) slog.Handler{
			func(b *bytes.Buffer) slog.Handler { return slog.NewJSONHandler(b, nil) },
			func(b *bytes.Buffer) slog.Handler { return slog.NewTextHandler(b, nil) },
		} {
			var buf bytes.Buffer
			slog.New(h(&buf)).Info("handling", "v", v, "all", []any{v})
			outputs = append(outputs, buf.String())
		}
		b, err := json.Marshal(map[string]any{"v": v})
		if err != nil {
			t.Fatal(err)
		}
		outputs = append(outputs, string(b))
		for _, out := range outputs {
			if strings.Contains(out, s) || strings.Contains(strings.ToUpper(out), fmt.Sprintf("%X", s)) {
				t.Errorf("%s shows a secret: %s", name, out)
			}
		}
		if out := fmt.Sprint(v); !strings.HasPrefix(out, name+"{") {
			t.Errorf("%s prints %q, want its description", name, out)
		}
	}
	if out := fmt.Sprint(values["Meta"]); !strings.Contains(out, "OrderPlaced") || !strings.Contains(out, "EventID:42") {
		t.Errorf("Meta hides what is no secret: %s", out)
	}
}
