package sqlcore

import (
	"errors"
	"testing"
)

// TestHideQuotedValues: the value a MySQL error quotes is hidden whole,
// quotes inside it included; the rest of the text stays, and the driver's
// error stays reachable.
func TestHideQuotedValues(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`Error 1366 (22007): Incorrect string value: '\xF0\x9F\x98\x80 S...' for column 'metadata' at row 1`,
			`Error 1366 (22007): Incorrect string value: [REDACTED] for column 'metadata' at row 1`},
		{`Error 1062 (23000): Duplicate entry 's-it's' for key' x' for key 'millpond_events_key_unique'`,
			`Error 1062 (23000): Duplicate entry [REDACTED] for key 'millpond_events_key_unique'`},
		{`Error 1366 (22007): Incorrect string value: '\xF0\x9F cut`, `Error 1366 (22007): Incorrect string value: [REDACTED]`},
		{"Error 1213 (40001): Deadlock found when trying to get lock", "Error 1213 (40001): Deadlock found when trying to get lock"},
	} {
		orig := errors.New(c.in)
		got := hideQuotedValues(orig)
		if got.Error() != c.want {
			t.Errorf("hideQuotedValues(%q)\n got %q\nwant %q", c.in, got.Error(), c.want)
		}
		if !errors.Is(got, orig) {
			t.Errorf("%q: the driver's error is no longer reachable", c.in)
		}
	}
	if hideQuotedValues(nil) != nil {
		t.Error("nil error changed")
	}
}
