package admin_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/millpond/millpond/admin"
	"github.com/millpond/millpond/outbox"
)

// TestEventDetailOfNestedJSONStaysSmall: a payload of 1 MiB of compact JSON
// nested 40 levels deep is valid JSON, and indenting it writes 80 spaces
// before each of its 130,000 lines: a 35 MB page that took seconds to
// render and more to display. The detail page shows all of it, in a page
// a few times the payload's size at most.
func TestEventDetailOfNestedJSONStaysSmall(t *testing.T) {
	f := newFixture(t, "sqlite")
	const depth = 40
	var b strings.Builder
	b.WriteString(strings.Repeat(`{"a":`, depth) + "[")
	elems := 0
	for b.Len() < outbox.MaxPayloadBytes-2000 {
		b.WriteString(`{"b":1},`)
		elems++
	}
	b.WriteString(`{"b":1}]` + strings.Repeat("}", depth))
	elems++
	id := f.enqueue(outbox.Event{Stream: "big", Key: "nested", Kind: "Big", Payload: []byte(b.String())})
	srv := f.serve(admin.Options{})
	status, body, _ := get(t, newClient(t), srv.URL+fmt.Sprintf("/events/%d", id))
	if status != http.StatusOK {
		t.Fatalf("GET: %d", status)
	}
	if limit := 4 * outbox.MaxPayloadBytes; len(body) > limit {
		t.Errorf("the detail page of a %d-byte payload is %d bytes, want at most %d", b.Len(), len(body), limit)
	}
	if n := strings.Count(body, "&#34;b&#34;"); n != elems {
		t.Errorf("the page shows %d of the payload's %d elements", n, elems)
	}
}
