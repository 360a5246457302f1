package admin

import (
	"encoding/json"
	"fmt"
	"log/slog"

	"github.com/millpond/millpond/dsn"
	"github.com/millpond/millpond/internal/safetext"
)

// String describes the options with CSRFKey hidden (it signs the forms'
// tokens: whoever knows it can forge them), so that an application
// printing or logging its Options shows no secret. Authorize and Logger
// are shown as set or not.
func (o Options) String() string {
	key := "unset"
	if o.CSRFKey != nil {
		key = dsn.Mask
	}
	return fmt.Sprintf("{ReadOnly:%t Prefix:%q Authorize:%s Logger:%s RefreshInterval:%s CSRFKey:%s Hosts:%q SecureCookie:%t}",
		o.ReadOnly, o.Prefix, setOrNot(o.Authorize != nil), setOrNot(o.Logger != nil), o.RefreshInterval, key, o.Hosts, o.SecureCookie)
}

func setOrNot(set bool) string {
	if set {
		return "set"
	}
	return "unset"
}

// GoString is String, so %#v hides the key too.
func (o Options) GoString() string { return o.String() }

// Format writes String for every verb (%q quotes it), so that no verb (%x
// or %v of the fields) prints the key.
func (o Options) Format(f fmt.State, verb rune) { safetext.Format(f, verb, o.String()) }

// LogValue is String, for log/slog.
func (o Options) LogValue() slog.Value { return slog.StringValue(o.String()) }

// MarshalJSON is String as a JSON string (marshalling the fields would fail
// on Authorize, a function, and would show the key).
func (o Options) MarshalJSON() ([]byte, error) { return json.Marshal(o.String()) }
