// Package fault holds fault-injection tests that run only against real
// databases: a worker process killed with SIGKILL mid-batch, a PostgreSQL
// server restarted under load, and several processes racing for the same
// events. Each test must be able to fail: it counts what was enqueued and
// what was delivered and compares them exactly.
//
// Child processes are this test binary re-executed with
// -test.run=^TestHelperWorker$ and MILLPOND_FAULT_ROLE naming the role; see
// TestHelperWorker.
package fault

import (
	"github.com/millpond/millpond/outbox/anydb"
	"github.com/millpond/millpond/outbox/sqlite"

	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx" for child processes

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// Environment of a child worker process.
const (
	envRole   = "MILLPOND_FAULT_ROLE"   // the child's role (see TestHelperWorker); unset in the parent
	envURL    = "MILLPOND_FAULT_URL"    // database URL for anydb.Open
	envStream = "MILLPOND_FAULT_STREAM" // stream to consume
	envName   = "MILLPOND_FAULT_NAME"   // worker name, used in claimed_by and handled rows
)

// Lines a child writes to stdout start with this prefix; everything else
// (the testing package's own output) is ignored by the parent.
const linePrefix = "FAULT "

// TestHelperWorker is not a test: it is the entry point of child worker
// processes, selected by MILLPOND_FAULT_ROLE. In a normal run it returns at
// once.
func TestHelperWorker(t *testing.T) {
	role := os.Getenv(envRole)
	if role == "" {
		t.Skip("helper process entry point; runs only as a child of the fault tests")
	}
	// A child must never outlive a parent that died without killing it.
	go func() {
		time.Sleep(2 * time.Minute)
		fmt.Fprintln(os.Stderr, "fault worker: parent did not stop me within 2 minutes; exiting")
		os.Exit(3)
	}()
	var err error
	switch role {
	case "kill-worker":
		err = killWorker()
	case "race-worker":
		err = raceWorker()
	case "ordered-worker":
		err = orderedWorker()
	case "held-worker":
		err = heldWorker()
	case "held-crasher":
		err = heldCrasher()
	default:
		err = fmt.Errorf("unknown role %q", role)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "fault worker %s: %v\n", os.Getenv(envName), err)
		os.Exit(1)
	}
	os.Exit(0)
}

// emit writes one protocol line to stdout for the parent.
var emitMu sync.Mutex

func emit(format string, args ...any) {
	emitMu.Lock()
	defer emitMu.Unlock()
	fmt.Fprintf(os.Stdout, linePrefix+format+"\n", args...)
}

// child is a running worker process.
type child struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan []string // protocol lines, split into fields, prefix removed
	done  chan struct{} // closed when the process has exited
	err   error         // the result of Wait, set before done closes
	mu    sync.Mutex
	log   strings.Builder // stderr
}

// startChild re-executes the test binary as a worker with the given role.
func startChild(t *testing.T, name, role string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperWorker$", "-test.count=1", "-test.timeout=3m")
	cmd.Env = append(os.Environ(), append([]string{envRole + "=" + role, envName + "=" + name}, env...)...)
	c := &child{name: name, cmd: cmd, lines: make(chan []string, 1024), done: make(chan struct{})}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("child %s: stdout pipe: %v", name, err)
	}
	if c.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatalf("child %s: stdin pipe: %v", name, err)
	}
	cmd.Stderr = writerFunc(func(p []byte) (int, error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.log.Write(p)
	})
	if err := cmd.Start(); err != nil {
		t.Fatalf("child %s: start: %v", name, err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), linePrefix); ok {
				c.lines <- strings.Fields(rest)
			}
		}
		close(c.lines)
		c.err = cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		select {
		case <-c.done:
		case <-time.After(5 * time.Second):
		}
	})
	return c
}

// stderr returns what the child wrote to stderr so far.
func (c *child) stderr() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.log.String()
}

// expect reads protocol lines until one starts with word, calling each for
// every line before it; it fails the test on timeout or early exit.
func (c *child) expect(t *testing.T, word string, timeout time.Duration, each func([]string)) []string {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case f, ok := <-c.lines:
			if !ok {
				t.Fatalf("child %s exited before %q; stderr:\n%s", c.name, word, c.stderr())
			}
			if len(f) > 0 && f[0] == word {
				return f
			}
			if each != nil {
				each(f)
			}
		case <-deadline:
			t.Fatalf("child %s: no %q within %s; stderr:\n%s", c.name, word, timeout, c.stderr())
		}
	}
}

// wait waits for the child to exit.
func (c *child) wait(t *testing.T, timeout time.Duration) error {
	t.Helper()
	lines, deadline := c.lines, time.After(timeout)
	for {
		select {
		case _, ok := <-lines: // drain, so the reader can reach Wait
			if !ok {
				lines = nil
			}
		case <-c.done:
			return c.err
		case <-deadline:
			t.Fatalf("child %s did not exit within %s; stderr:\n%s", c.name, timeout, c.stderr())
			return nil
		}
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// openStore opens a store from a child's environment.
func openStore(ctx context.Context) (*outbox.Store, error) {
	s, err := anydb.Open(ctx, os.Getenv(envURL), outbox.WithoutListen())
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	return s, nil
}

// openSQL opens a database/sql handle on the database a testdb URL names,
// for writes of the application's own (the handled table).
func openSQL(rawURL string) (*sql.DB, string, error) {
	switch {
	case strings.HasPrefix(rawURL, "postgres"):
		db, err := sql.Open("pgx", rawURL)
		return db, "postgres", err
	case strings.HasPrefix(rawURL, "mysql://"), strings.HasPrefix(rawURL, "mariadb://"):
		u, err := url.Parse(rawURL)
		if err != nil {
			return nil, "", fmt.Errorf("openSQL: %w", err)
		}
		cfg := mysql.NewConfig()
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
		cfg.Net, cfg.Addr, cfg.DBName = "tcp", u.Host, strings.TrimPrefix(u.Path, "/")
		db, err := sql.Open("mysql", cfg.FormatDSN())
		return db, "mysql", err
	case strings.HasPrefix(rawURL, "sqlite:"):
		db, err := sql.Open("sqlite", sqlite.DSN(strings.TrimPrefix(rawURL, "sqlite:")))
		return db, "sqlite", err
	}
	return nil, "", fmt.Errorf("openSQL: unsupported URL scheme in %q", strings.SplitN(rawURL, ":", 2)[0])
}

// placeholder returns the n-th (1-based) bind parameter of a dialect.
func placeholder(dialect string, n int) string {
	if dialect == "postgres" {
		return "$" + strconv.Itoa(n)
	}
	return "?"
}

// enqueueN enqueues n events named prefix-0 ... in transactions of 250,
// four transactions at a time.
func enqueueN(t *testing.T, db *testdb.Database, store *outbox.Store, stream, prefix string, n int) {
	t.Helper()
	const chunk = 250
	ctx := context.Background()
	work := make(chan int)
	errs := make(chan error, 4)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for start := range work {
				if err := enqueueRange(ctx, db, store, stream, prefix, start, min(start+chunk, n)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	go func() {
		defer close(work)
		for start := 0; start < n; start += chunk {
			select {
			case work <- start:
			case err := <-errs:
				errs <- err
				return
			}
		}
	}()
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
}

// enqueueRange enqueues events [from, to) in one transaction of the
// caller's kind (pgx.Tx or *sql.Tx).
func enqueueRange(ctx context.Context, db *testdb.Database, store *outbox.Store, stream, prefix string, from, to int) (err error) {
	var tx any
	var commit func() error
	var rollback func()
	if db.Pool != nil {
		ptx, err := db.Pool.Begin(ctx)
		if err != nil {
			return fmt.Errorf("begin: %w", err)
		}
		tx, commit, rollback = ptx, func() error { return ptx.Commit(ctx) }, func() { _ = ptx.Rollback(ctx) }
	} else {
		stx, err := db.SQL.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("begin: %w", err)
		}
		tx, commit, rollback = stx, stx.Commit, func() { _ = stx.Rollback() }
	}
	for i := from; i < to; i++ {
		ev := outbox.Event{Stream: stream, Key: fmt.Sprintf("%s-%d", prefix, i), Kind: "FaultEvent", Payload: []byte(strconv.Itoa(i))}
		if _, err := store.Enqueue(ctx, testdb.Wrap(tx), ev); err != nil {
			rollback()
			return fmt.Errorf("enqueue %d: %w", i, err)
		}
	}
	if err := commit(); err != nil {
		return fmt.Errorf("commit events %d-%d: %w", from, to-1, err)
	}
	return nil
}

// statusCounts returns the number of rows of the stream in each status.
func statusCounts(t *testing.T, db *testdb.Database, stream string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, st := range []string{outbox.StatusPending, outbox.StatusProcessing, outbox.StatusDelivered, outbox.StatusDead} {
		q := fmt.Sprintf("SELECT COUNT(*) FROM millpond_outbox WHERE stream = '%s' AND status = '%s'", stream, st)
		out[st] = db.Count(t, q)
	}
	return out
}
