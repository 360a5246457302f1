package admin_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/millpond/millpond/admin"
	"github.com/millpond/millpond/outbox"
)

// TestPagesEscapeSpoofingCharacters: a failure text, a payload or a
// metadata value holding a bidirectional override, a zero-width character
// or a line separator would show the operator other text than is stored
// (U+202E turns "refund 001$" into "refund $100"). The pages show such
// characters as \u escapes; newlines of a pretty-printed payload stay.
func TestPagesEscapeSpoofingCharacters(t *testing.T) {
	f := newFixture(t, "sqlite")
	const (
		reason  = "limit exceeded for amount \u202E001$\u202C, see\u2028log"
		payload = `{"note":"pay ` + "\u202E" + `001$","hidden":"a` + "\u200B" + `b"}`
		meta    = "x\u2066y\u2069"
	)
	id := f.enqueue(outbox.Event{Stream: "spoof", Key: "k", Kind: "K", Payload: []byte(payload),
		Metadata: map[string]string{"note": meta}})
	for _, c := range f.claim("spoof", "", 1) {
		f.fail(c, reason, 1)
	}
	srv := f.serve(admin.Options{Prefix: "/admin"})
	c := newClient(t)
	for _, page := range []string{"/admin/dead?stream=spoof", fmt.Sprintf("/admin/events/%d", id)} {
		code, body, _ := get(t, c, srv.URL+page)
		if code != http.StatusOK {
			t.Fatalf("%s: %d", page, code)
		}
		for _, r := range []string{"\u202E", "\u202C", "\u2028", "\u200B", "\u2066", "\u2069"} {
			if strings.Contains(body, r) {
				t.Errorf("%s shows U+%04X unescaped", page, []rune(r)[0])
			}
		}
		if !strings.Contains(body, `amount \u202E001$\u202C, see\u2028log`) {
			t.Errorf("%s does not show the failure text escaped", page)
		}
	}
	_, body, _ := get(t, c, fmt.Sprintf("%s/admin/events/%d", srv.URL, id))
	for _, want := range []string{"pay \\u202E001$", "a\\u200Bb", "x\\u2066y\\u2069", "{\n  &#34;note&#34;"} {
		if !strings.Contains(body, want) {
			t.Errorf("event page lacks %q", want)
		}
	}
}
