package admin_test

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/millpond/millpond/admin"
)

// TestOptionsNeverPrintTheCSRFKey: Options printed with any verb, logged
// through log/slog or marshalled as JSON never shows its CSRF key, in any
// encoding.
func TestOptionsNeverPrintTheCSRFKey(t *testing.T) {
	key := []byte("0123456789-secret-csrf-key-ABCDEF")
	o := admin.Options{Prefix: "/admin", CSRFKey: key, Hosts: []string{"ops.example"},
		Authorize: func(*http.Request) error { return nil }}
	var outs []string
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%x", "%X", "%q", "%d", "%20.5v"} {
		outs = append(outs, fmt.Sprintf(verb, o), fmt.Sprintf(verb, &o))
	}
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("admin", "options", o)
	slog.New(slog.NewTextHandler(&buf, nil)).Info("admin", "options", o)
	outs = append(outs, buf.String())
	b, err := json.Marshal(struct{ Admin admin.Options }{o})
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	outs = append(outs, string(b))
	forms := []string{string(key), hex.EncodeToString(key), strings.ToUpper(hex.EncodeToString(key)), "48 49 50 51", "[48 49"}
	for _, out := range outs {
		for _, f := range forms {
			if strings.Contains(out, f) {
				t.Errorf("output shows the CSRF key (%q): %s", f, out)
			}
		}
	}
	if s := o.String(); !strings.Contains(s, `Prefix:"/admin"`) || !strings.Contains(s, "CSRFKey:xxxxx") || !strings.Contains(s, "Authorize:set") {
		t.Errorf("String: %s", s)
	}
}
