package sqlcore

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

// Slices and structs holding claims are marshalled by slog's JSON handler
// and by encoding/json; neither may show the secrets.
func TestRedactionInSlicesAndJSON(t *testing.T) {
	secrets := []string{"tenant-secret-stream", "order-secret-key", "0123456789abcdef0123456789abcdef", "card=4111"}
	c := Claimed{ID: 7, Stream: secrets[0], Key: secrets[1], ClaimKey: secrets[2], Payload: []byte(secrets[3]), Kind: "OrderPlaced"}
	values := map[string]any{
		"claims":   []Claimed{c, c},
		"receipts": []Receipt{c.Receipt()},
		"events":   []Event{{Stream: secrets[0], Key: secrets[1], Kind: "K", Payload: []byte(secrets[3])}},
		"dead":     []DeadEvent{{ID: 1, Stream: secrets[0], Key: secrets[1]}},
		"struct":   struct{ C Claimed }{c},
	}
	for name, v := range values {
		var buf bytes.Buffer
		slog.New(slog.NewJSONHandler(&buf, nil)).Info("x", "v", v)
		j, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		for _, out := range []string{buf.String(), string(j), fmt.Sprintf("%v %+v %#v", v, v, v)} {
			for _, secret := range secrets {
				if strings.Contains(out, secret) {
					t.Errorf("%s: %q leaks %q", name, out, secret)
				}
			}
		}
		if !strings.Contains(string(j), redacted) {
			t.Errorf("%s: %s shows no redaction marker", name, j)
		}
	}
}
