package tests

import (
	"github.com/millpond/millpond/outbox/anydb"

	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/millpond/millpond/dsn"
	"github.com/millpond/millpond/outbox"
)

// Open refuses addresses of unknown forms with dsn.ErrUnsupported, reports
// unreachable databases with ErrOpen, never shows the password in either,
// and never creates a file named after an address it did not understand.
func TestOpenErrorsNeverShowThePassword(t *testing.T) {
	const secret = "open-Unique-Pw-3321"
	t.Chdir(t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, c := range []struct {
		addr string
		want error
	}{
		{"nonsense://", dsn.ErrUnsupported},
		{"orders.db", dsn.ErrUnsupported},
		{"postgress://u:" + secret + "@127.0.0.1/db", dsn.ErrUnsupported},
		{"u:" + secret + "@tcp(127.0.0.1:3306)/db", dsn.ErrUnsupported},
		{"sqlite:", dsn.ErrUnsupported},
		{"host=127.0.0.1 port=1 user=u password=" + secret + " dbname=d connect_timeout=2", outbox.ErrOpen},
		{"host=127.0.0.1 port=1 user=u password='" + secret + "' dbname=d sslmode=bogus", outbox.ErrOpen},
		{"postgres://u:" + secret + "@127.0.0.1:1/db?connect_timeout=2", outbox.ErrOpen},
		{"postgres://u@127.0.0.1:1/db?connect_timeout=2&password=" + secret, outbox.ErrOpen},
		{"mysql://u:" + secret + "@127.0.0.1:1/db", outbox.ErrOpen},
		{"mysql://u:" + secret + "@127.0.0.1:3306/db?timeout=bogus", outbox.ErrOpen},
		{"sqlite:" + t.TempDir() + "/missing-dir/x.db?mode=ro", outbox.ErrOpen},
	} {
		s, err := anydb.Open(ctx, c.addr)
		if err == nil {
			s.Close()
			t.Errorf("%s: opened", dsn.Redact(c.addr))
			continue
		}
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v does not wrap %v", dsn.Redact(c.addr), err, c.want)
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("the error shows the password: %v", err)
		}
	}
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("Open created %q in the working directory", e.Name())
	}
}
