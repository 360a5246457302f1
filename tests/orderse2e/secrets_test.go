package orderse2e

import (
	"fmt"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/millpond/millpond/dsn"
	"github.com/millpond/millpond/internal/testdb"
)

// TestExampleNeverPrintsThePassword runs the example service with a unique
// password in its database address, in every form, and checks its whole
// output: a service that starts (PostgreSQL's trust authentication ignores
// the password), one whose database cannot be reached, and addresses of
// forms it refuses.
func TestExampleNeverPrintsThePassword(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the example service")
	}
	const secret = "ex-Unique-Pw-5092"
	bin := buildExample(t)
	db := testdb.New(t, "postgres")
	withPassword, kv := db.WithPassword(t, secret)
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}

	for i, addr := range []string{kv, withPassword} {
		logPath := filepath.Join(t.TempDir(), fmt.Sprintf("orders-%d.log", i))
		s := startService(t, bin, addr, freeAddr(t), logPath)
		s.stop(t)
		out := readFile(t, logPath)
		if strings.Contains(out, secret) {
			t.Errorf("%s: the service's output shows the password:\n%s", dsn.Redact(addr), out)
		}
		if !strings.Contains(out, "opened the outbox store") || !strings.Contains(out, "xxxxx") {
			t.Errorf("%s: the service did not log the database it opened, redacted:\n%s", dsn.Redact(addr), out)
		}
	}

	for _, addr := range []string{
		strings.Replace(kv, "port="+u.Port(), "port=1", 1) + " connect_timeout=2",
		"postgres://admin:" + secret + "@127.0.0.1:1/db?connect_timeout=2",
		"mysql://admin:" + secret + "@127.0.0.1:1/db",
		"postgress://admin:" + secret + "@127.0.0.1/db",
		"admin:" + secret + "@tcp(127.0.0.1:3306)/db",
		secret,
	} {
		out, err := exec.Command(bin, "-addr", freeAddr(t), "-db", addr).CombinedOutput()
		if err == nil {
			t.Errorf("%s: the service ran", dsn.Redact(addr))
		}
		if strings.Contains(string(out), secret) {
			t.Errorf("%s: the output shows the password:\n%s", dsn.Redact(addr), out)
		}
		if len(out) == 0 {
			t.Errorf("%s: the service failed without a word", dsn.Redact(addr))
		}
	}
}
