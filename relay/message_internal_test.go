package relay

import (
	"errors"
	"maps"
	"slices"
	"testing"

	"github.com/millpond/millpond/outbox"
)

// TestReusedMessageCarriesNothingOver: a message of a confirmed publish
// reused for the next event (recycle, then natsMsg) has exactly the
// headers, subject and payload a new message of that event has, whatever
// the previous event had (metadata, an ordering key, neither); the subject
// cache gives the template's subject.
func TestReusedMessageCarriesNothingOver(t *testing.T) {
	for _, tmpl := range []string{DefaultSubjectTemplate, OrderingKeySubjectTemplate} {
		parsed, err := parseTemplate(tmpl, DefaultSubjectPrefix)
		if err != nil {
			t.Fatal(err)
		}
		events := []outbox.Claimed{
			{Stream: "s", Key: "k.1", Kind: "A", Payload: []byte("1")},
			{Stream: "s", Key: "k.2", Kind: "B", Payload: []byte("2"), Metadata: map[string]string{"Trace": "t2", "Tenant": "x"}},
			{Stream: "s", Key: "k.3", Kind: "A", Payload: []byte("3"), OrderingKey: "o.1", OrderingSeq: 7},
			{Stream: "t", Key: "k.4", Kind: "A", Payload: []byte("4"), OrderingKey: "o.2", OrderingSeq: 1, Metadata: map[string]string{"Trace": "t4"}},
			{Stream: "t", Key: "k.5", Kind: "B", Payload: []byte("5"), Metadata: map[string]string{outbox.MetadataKind: "B"}},
		}
		// Every event after every event, so each kind of message is
		// reused for each kind of event.
		reuses := 0
		for _, prev := range events {
			for _, next := range events {
				fresh := &JetStream{tmpl: parsed, subjects: map[streamKind]string{}}
				want, err := fresh.natsMsg(&next)
				if err != nil {
					t.Fatal(err)
				}
				r := &JetStream{tmpl: parsed, subjects: map[streamKind]string{}}
				m, err := r.natsMsg(&prev)
				if err != nil {
					t.Fatal(err)
				}
				r.recycle(m)
				got, err := r.natsMsg(&next)
				if err != nil {
					t.Fatal(err)
				}
				if got == m {
					reuses++
				}
				if !maps.EqualFunc(got.Header, want.Header, slices.Equal) || got.Subject != want.Subject || string(got.Data) != string(want.Data) || got.Reply != "" {
					t.Errorf("%s: %s then %s: reused message %q %q %v, want %q %q %v", tmpl, prev.Key, next.Key,
						got.Subject, got.Data, got.Header, want.Subject, want.Data, want.Header)
				}
				if wantSubject := parsed.subject(next.Stream, next.Kind, next.Key, next.OrderingKey); want.Subject != wantSubject {
					t.Errorf("%s: subject of %s %q, want %q", tmpl, next.Key, want.Subject, wantSubject)
				}
			}
		}
		// A sync.Pool may drop what it is given (a quarter of it under the
		// race detector), but not every time.
		if reuses == 0 {
			t.Fatalf("%s: no recycled message was reused", tmpl)
		}
	}
}

// TestJetStreamDefaultWindow: the JetStream relay publishes up to
// DefaultJetStreamWindow (1000) events at once unless told otherwise;
// other relays keep DefaultWindow.
func TestJetStreamDefaultWindow(t *testing.T) {
	var js JetStreamConfig
	js.setJetStreamDefaults()
	if js.Window != DefaultJetStreamWindow || DefaultJetStreamWindow != 1000 {
		t.Fatalf("JetStream relay window %d, want %d (1000)", js.Window, DefaultJetStreamWindow)
	}
	js = JetStreamConfig{Config: Config{Window: 64}}
	js.setJetStreamDefaults()
	if js.Window != 64 {
		t.Fatalf("a window set stays: got %d, want 64", js.Window)
	}
	var c Config
	c.setDefaults()
	if c.Window != DefaultWindow {
		t.Fatalf("other relays' window %d, want %d", c.Window, DefaultWindow)
	}
}

// TestFailureTextRedactsWholeWords: the event's key, ordering key and
// stream are taken out of a broker client's error where they stand as
// words of their own (a subject's segments among them), never out of the
// middle of other words; values of one or two characters are left.
func TestFailureTextRedactsWholeWords(t *testing.T) {
	c := &outbox.Claimed{Key: "customer-ada.lovelace", OrderingKey: "acct", Stream: "orders"}
	for _, tc := range []struct{ err, want string }{
		{"broker refused message customer-ada.lovelace on topic events.orders.OrderPlaced",
			"relay: broker refused message [REDACTED] on topic events.[REDACTED].OrderPlaced"},
		{"orders-archive is full (subject events.orders.acct, key acct:1)",
			"relay: orders-archive is full (subject events.[REDACTED].[REDACTED], key [REDACTED]:1)"},
		{"account acct2 and acctx are other words; acct is not", "relay: account acct2 and acctx are other words; [REDACTED] is not"},
		// In a subject a key's dots are '~' (EncodeToken).
		{"no responders on events.orders.OrderPlaced.customer-ada~lovelace (msg id orders/customer-ada.lovelace)",
			"relay: no responders on events.[REDACTED].OrderPlaced.[REDACTED] (msg id [REDACTED]/[REDACTED])"},
	} {
		if got := failureText(errors.New(tc.err), c); got != tc.want {
			t.Errorf("failureText(%q)\n got %q\nwant %q", tc.err, got, tc.want)
		}
	}
	dotted := &outbox.Claimed{Key: "k", OrderingKey: "acct.7", Stream: "shop.orders"}
	if got, want := failureText(errors.New("subject events.shop~orders.Paid.acct~7 full"), dotted), "relay: subject events.[REDACTED].Paid.[REDACTED] full"; got != want {
		t.Errorf("encoded stream and ordering key:\n got %q\nwant %q", got, want)
	}
	short := &outbox.Claimed{Key: "e2", Stream: "s"}
	if got := failureText(errors.New("stream s: e2 refused"), short); got != "relay: stream s: e2 refused" {
		t.Errorf("short values: %q", got)
	}
}
