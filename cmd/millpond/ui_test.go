package main

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/millpond/millpond/internal/testdb"
)

// lockedBuffer is an io.Writer safe to read while the command writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestUIHelp(t *testing.T) {
	code, _, stderr := cli(t, nil, "ui", "-h")
	if code != exitOK || !strings.Contains(stderr, "Usage: millpond ui") || !strings.Contains(stderr, "-read-only") ||
		!strings.Contains(stderr, defaultUIAddr) {
		t.Fatalf("ui -h: %d\n%s", code, stderr)
	}
	if code, _, _ := cli(t, nil, "ui", "extra"); code != exitUsage {
		t.Fatalf("ui with an argument: %d", code)
	}
}

var servingRE = regexp.MustCompile(`at (http://\S+/)\n`)

// TestUIServes runs "millpond ui" on PostgreSQL with a password in the
// address: it serves the overview under the prefix, read-only, never prints
// the password, and stops when its context ends.
func TestUIServes(t *testing.T) {
	db := testdb.New(t, "postgres")
	db.Store(t) // migrated
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	const password = "ui-s3cret-pw" // the test server trusts local connections and ignores it
	u.User = url.UserPassword(u.User.Username(), password)
	base, stdout, stderr, stop := startUI(t, "-db", u.String(), "ui", "-addr", "127.0.0.1:0", "-read-only", "-prefix", "/admin", "-hosts", "ops.example.com")
	if !strings.HasPrefix(base, "http://127.0.0.1:") || !strings.HasSuffix(base, "/admin/") {
		t.Fatalf("serving at %q", base)
	}
	resp, err := http.Get(base)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "Read-only") ||
		resp.Header.Get("Content-Security-Policy") == "" {
		t.Fatalf("GET %s: %d\n%s", base, resp.StatusCode, body)
	}
	// -hosts names the hosts answered besides IP addresses; another name
	// (a rebound attacker's domain) is refused.
	for host, want := range map[string]int{"ops.example.com": http.StatusOK, "rebind.attacker.example": http.StatusMisdirectedRequest} {
		req, _ := http.NewRequest(http.MethodGet, base, nil)
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s for host %s: %d, want %d", base, host, resp.StatusCode, want)
		}
	}
	stop()
	for _, out := range []string{stdout.String(), stderr.String(), string(body)} {
		if strings.Contains(out, password) {
			t.Fatalf("the password was printed: %s", out)
		}
	}
	if strings.Contains(stderr.String(), "warning") {
		t.Errorf("a loopback address drew a warning: %s", stderr.String())
	}
}

// startUI runs millpond with args (a "ui" command listening on
// 127.0.0.1:0) until the test ends or stop is called, and returns the
// address it serves at; stop fails the test unless it exits cleanly.
func startUI(t *testing.T, args ...string) (base string, stdout, stderr *lockedBuffer, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stdout, stderr = &lockedBuffer{}, &lockedBuffer{}
	done := make(chan int, 1)
	go func() { done <- run(ctx, args, stdout, stderr, func(string) string { return "" }) }()
	for deadline := time.Now().Add(20 * time.Second); base == ""; {
		if m := servingRE.FindStringSubmatch(stdout.String()); m != nil {
			base = m[1]
		} else if time.Now().After(deadline) {
			t.Fatalf("ui did not start:\n%s\n%s", stdout.String(), stderr.String())
		}
		select {
		case code := <-done:
			t.Fatalf("ui exited with %d:\n%s\n%s", code, stdout.String(), stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	stop = func() {
		t.Helper()
		cancel()
		select {
		case code := <-done:
			if code != exitOK {
				t.Fatalf("ui exited with %d: %s", code, stderr.String())
			}
		case <-time.After(10 * time.Second):
			t.Fatal("ui did not stop")
		}
	}
	return base, stdout, stderr, stop
}

// TestUISecureCookie: with -secure-cookie the UI's CSRF cookie is Secure
// even over plain HTTP (a TLS-terminating proxy in front that says
// nothing); without it, over plain HTTP, it is not.
func TestUISecureCookie(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ui.db")
	if code, _, stderr := cli(t, nil, "-db", "sqlite:"+path, "migrate"); code != exitOK {
		t.Fatalf("migrate: %d %s", code, stderr)
	}
	for _, secure := range []bool{false, true} {
		args := []string{"-db", "sqlite:" + path, "ui", "-addr", "127.0.0.1:0"}
		if secure {
			args = append(args, "-secure-cookie")
		}
		base, _, _, stop := startUI(t, args...)
		resp, err := http.Get(base + "dead")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		var found bool
		for _, c := range resp.Cookies() {
			if c.Name == "millpond_admin_csrf" {
				found = true
				if c.Secure != secure {
					t.Errorf("-secure-cookie %v: the CSRF cookie's Secure is %v", secure, c.Secure)
				}
			}
		}
		if !found {
			t.Errorf("-secure-cookie %v: GET %sdead (%d) set no CSRF cookie", secure, base, resp.StatusCode)
		}
		stop()
	}
}

// TestUIRefusesMissingSchema: pointed at a database without the outbox
// schema (the wrong database name, say), "millpond ui" started and served
// every page as a 500 whose cause only its log showed. It now refuses to
// start, as the other commands do, saying the schema is not installed.
func TestUIRefusesMissingSchema(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			db := testdb.New(t, dialect) // not migrated
			createSQLiteFile(t, db)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			var stdout, stderr lockedBuffer
			code := run(ctx, []string{"-db", db.URL, "ui", "-addr", "127.0.0.1:0"}, &stdout, &stderr, func(string) string { return "" })
			if code != exitFailure || !strings.Contains(stderr.String(), "the outbox schema is not installed") || stdout.String() != "" {
				t.Fatalf("ui on a database without the schema: code %d, stdout %q, stderr %q; want %d and the schema named",
					code, stdout.String(), stderr.String(), exitFailure)
			}
		})
	}
}

// TestMistypedSQLitePathCreatesNothing: a command that needs the schema,
// given a SQLite file that does not exist (a mistyped path), says so and
// leaves no empty database file behind; migrate still creates it.
func TestMistypedSQLitePathCreatesNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ordres.db")
	for _, args := range [][]string{{"stats"}, {"dead", "list", "-stream", "orders"}, {"ui", "-addr", "127.0.0.1:0"}} {
		var stdout, stderr lockedBuffer
		code := run(context.Background(), append([]string{"-db", "sqlite:" + path}, args...), &stdout, &stderr, func(string) string { return "" })
		if code != exitFailure || !strings.Contains(stderr.String(), "does not exist") {
			t.Errorf("%v on a missing SQLite file: code %d, stderr %q; want %d and the file named missing", args, code, stderr.String(), exitFailure)
		}
		if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("%v created the mistyped database file (%v)", args, err)
		}
	}
	var stdout, stderr lockedBuffer
	if code := run(context.Background(), []string{"-db", "sqlite:" + path, "migrate"}, &stdout, &stderr, func(string) string { return "" }); code != 0 {
		t.Fatalf("migrate: code %d, stderr %q", code, stderr.String())
	}
	if code := run(context.Background(), []string{"-db", "sqlite:" + path, "stats"}, &stdout, &stderr, func(string) string { return "" }); code != 0 {
		t.Fatalf("stats after migrate: code %d, stderr %q", code, stderr.String())
	}
}

// createSQLiteFile creates the (empty) file of an unmigrated SQLite test
// database, which its first opening would: commands that need the schema
// refuse a file that does not exist before they open it.
func createSQLiteFile(t *testing.T, db *testdb.Database) {
	t.Helper()
	if db.Dialect != "sqlite" {
		return
	}
	name, _, _ := strings.Cut(strings.TrimPrefix(db.URL, "sqlite:"), "?")
	if err := os.WriteFile(name, nil, 0o600); err != nil {
		t.Fatal(err)
	}
}
