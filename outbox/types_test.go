package outbox_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/millpond/millpond/internal/sqlcore"
	"github.com/millpond/millpond/outbox"
)

// Every public type that can hold a stream, key, payload or claim key hides
// them in every way a value gets printed: fmt's %v, %+v and %#v (on values,
// pointers, slices and structs holding them), log/slog's text and JSON
// handlers and encoding/json.
func TestOutboxTypesRedact(t *testing.T) {
	const (
		stream   = "tenant-secret-stream"
		group    = "secret-group"
		key      = "order-secret-key"
		claimKey = "0123456789abcdef0123456789abcdef"
		payload  = "card=4111111111111111"
	)
	secrets := []string{stream, group, key, claimKey, payload}
	ev := outbox.Event{Stream: stream, Key: key, Kind: "OrderPlaced", Payload: []byte(payload), Metadata: map[string]string{"m": "v"}, Delay: time.Second}
	c := outbox.Claimed{ID: 7, Stream: stream, Group: group, Key: key, Kind: "OrderPlaced", Payload: []byte(payload), ClaimKey: claimKey, Attempts: 1}
	r := c.Receipt()
	d := outbox.DeadEvent{ID: 1, Stream: stream, Group: group, Key: key, Kind: "OrderPlaced", LastError: "boom"}
	values := map[string]any{
		"Event":            ev,
		"*Event":           &ev,
		"[]Event":          []outbox.Event{ev, ev},
		"Claimed":          c,
		"*Claimed":         &c,
		"[]Claimed":        []outbox.Claimed{c},
		"Receipt":          r,
		"*Receipt":         &r,
		"[]Receipt":        []outbox.Receipt{r},
		"DeadEvent":        d,
		"*DeadEvent":       &d,
		"[]DeadEvent":      []outbox.DeadEvent{d},
		"struct{Claimed}":  struct{ C outbox.Claimed }{c},
		"map[string]Event": map[string]outbox.Event{"e": ev},
	}
	for name, v := range values {
		t.Run(name, func(t *testing.T) {
			var text, js bytes.Buffer
			slog.New(slog.NewTextHandler(&text, nil)).Info("x", "v", v)
			slog.New(slog.NewJSONHandler(&js, nil)).Info("x", "v", v)
			j, err := json.Marshal(v)
			if err != nil {
				t.Fatal(err)
			}
			outputs := map[string]string{
				"%v": fmt.Sprintf("%v", v), "%+v": fmt.Sprintf("%+v", v), "%#v": fmt.Sprintf("%#v", v),
				"%s": fmt.Sprintf("%s", v), "slog text": text.String(), "slog JSON": js.String(), "json.Marshal": string(j),
			}
			for form, out := range outputs {
				for _, secret := range secrets {
					if strings.Contains(out, secret) {
						t.Errorf("%s: %s leaks %q", form, out, secret)
					}
				}
				if !strings.Contains(out, "[REDACTED]") {
					t.Errorf("%s: %s shows no redaction marker", form, out)
				}
			}
		})
	}
}

// The outbox types keep their sqlcore counterparts' validation.
func TestOutboxTypesValidate(t *testing.T) {
	good := outbox.Event{Stream: "s", Key: "k", Kind: "K", Payload: []byte("{}")}
	if err := good.Validate(); err != nil {
		t.Fatalf("valid event: %v", err)
	}
	bad := good
	bad.Key = "has space"
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "event key") {
		t.Errorf("event with a bad key: %v", err)
	}
	req := outbox.ClaimRequest{Stream: "s", Worker: "w", Limit: 10, Lease: 30 * time.Second, MaxAttempts: 3}
	if err := req.Validate(); err != nil {
		t.Fatalf("valid claim request: %v", err)
	}
	req.Limit = 0
	if err := req.Validate(); err == nil {
		t.Error("claim request with limit 0 validated")
	}
	f := outbox.Failure{Reason: "boom", MaxAttempts: 3, RetryDelay: time.Second}
	if err := f.Validate(); err != nil {
		t.Fatalf("valid failure: %v", err)
	}
	f.RetryDelay = -time.Second
	if err := f.Validate(); err == nil {
		t.Error("failure with a negative delay validated")
	}
}

// The status constants are written out in outbox so that go doc shows their
// values; they must stay the values the SQL writes.
func TestStatusesMatchTheSQL(t *testing.T) {
	for got, want := range map[string]string{
		outbox.StatusPending:    sqlcore.StatusPending,
		outbox.StatusProcessing: sqlcore.StatusProcessing,
		outbox.StatusDelivered:  sqlcore.StatusDelivered,
		outbox.StatusDead:       sqlcore.StatusDead,
	} {
		if got != want {
			t.Errorf("outbox status %q, the SQL writes %q", got, want)
		}
	}
}
