package fault

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/millpond/millpond/internal/testdb"
)

// envPostgresBin overrides where the private cluster's PostgreSQL server
// binaries (initdb, pg_ctl) are looked up.
const envPostgresBin = "MILLPOND_PG_BINDIR"

// pgCluster is a private PostgreSQL server for one test, so that a test may
// stop and restart it without disturbing the shared server other packages
// use concurrently.
type pgCluster struct {
	bin  string // directory of initdb and pg_ctl
	dir  string // owns data/ and server.log
	data string
	port int
	// runAs runs the server tools as this OS user through runuser, because
	// initdb and postgres refuse to run as root.
	runAs  string
	runner string
}

// URL is the cluster's superuser connection URL.
func (c *pgCluster) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// skipOrFail skips the test, or fails it when databases are required.
func skipOrFail(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if testdb.Required() {
		t.Fatalf("%s, and MILLPOND_REQUIRE_DATABASES=1 forbids skipping", msg)
	}
	t.Skip(msg)
}

// findPostgresBin locates initdb and pg_ctl: $MILLPOND_PG_BINDIR, then
// PATH, then pg_config --bindir, then the versioned directories that
// Debian-style packages install (newest first).
func findPostgresBin() (string, error) {
	has := func(dir string) bool {
		for _, tool := range []string{"initdb", "pg_ctl"} {
			if st, err := os.Stat(filepath.Join(dir, tool)); err != nil || st.IsDir() {
				return false
			}
		}
		return true
	}
	if dir := os.Getenv(envPostgresBin); dir != "" {
		if has(dir) {
			return dir, nil
		}
		return "", fmt.Errorf("%s=%s has no initdb and pg_ctl", envPostgresBin, dir)
	}
	if p, err := exec.LookPath("pg_ctl"); err == nil && has(filepath.Dir(p)) {
		return filepath.Dir(p), nil
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if dir := strings.TrimSpace(string(out)); has(dir) {
			return dir, nil
		}
	}
	candidates, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(candidates, func(i, j int) bool { return versionOf(candidates[i]) > versionOf(candidates[j]) })
	for _, dir := range candidates {
		if has(dir) {
			return dir, nil
		}
	}
	return "", fmt.Errorf("no PostgreSQL server binaries (initdb, pg_ctl) on PATH, from pg_config or in /usr/lib/postgresql/*/bin; set %s", envPostgresBin)
}

func versionOf(binDir string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(binDir)), 64)
	return v
}

// freePort asks the kernel for a free TCP port on the loopback interface.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startPGCluster initialises and starts a private cluster, stopped and
// removed at cleanup. It skips (or fails when databases are required) when
// no server binaries are installed.
func startPGCluster(t *testing.T) *pgCluster {
	t.Helper()
	bin, err := findPostgresBin()
	if err != nil {
		skipOrFail(t, "private PostgreSQL cluster: %v", err)
	}
	c := &pgCluster{bin: bin}
	// t.TempDir lives under a mode-0700 directory that another OS user
	// cannot enter, so make our own, world-traversable.
	if c.dir, err = os.MkdirTemp("", "millpond-pg-"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(c.dir) })
	if err := os.Chmod(c.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	c.data = filepath.Join(c.dir, "data")
	if os.Geteuid() == 0 {
		if err := c.prepareRunAs("postgres"); err != nil {
			skipOrFail(t, "private PostgreSQL cluster as root: %v", err)
		}
	}
	if c.port, err = freePort(); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if out, err := c.tool(ctx, "initdb", "-D", c.data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync", "--no-instructions"); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	conf := fmt.Sprintf("\n# millpond fault test\nport = %d\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '%s'\nfsync = off\nmax_connections = 60\n", c.port, c.dir)
	f, err := os.OpenFile(filepath.Join(c.data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString(conf)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		t.Fatalf("configure cluster: %v", err)
	}
	if out, err := c.pgCtl(ctx, "start", "-l", filepath.Join(c.dir, "server.log")); err != nil {
		t.Fatalf("pg_ctl start: %v\n%s\n%s", err, out, c.serverLog())
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if out, err := c.pgCtl(ctx, "stop", "-m", "immediate"); err != nil {
			t.Logf("pg_ctl stop: %v\n%s", err, out)
		}
	})
	return c
}

// prepareRunAs lets name own the cluster directory and records how to run
// the tools as that user.
func (c *pgCluster) prepareRunAs(name string) error {
	u, err := user.Lookup(name)
	if err != nil {
		return fmt.Errorf("initdb refuses to run as root and there is no %q OS user: %w", name, err)
	}
	runner, err := exec.LookPath("runuser")
	if err != nil {
		return fmt.Errorf("initdb refuses to run as root and runuser is not installed: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(c.dir, uid, gid); err != nil {
		return fmt.Errorf("chown cluster directory: %w", err)
	}
	// Every parent must be traversable by that user.
	for dir := filepath.Dir(c.dir); ; dir = filepath.Dir(dir) {
		st, err := os.Stat(dir)
		if err != nil {
			return err
		}
		if st.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("%s is not traversable by other users; set TMPDIR to a directory that is", dir)
		}
		if dir == filepath.Dir(dir) {
			break
		}
	}
	c.runAs, c.runner = name, runner
	return nil
}

// tool runs one of the server binaries, as the cluster's OS user.
func (c *pgCluster) tool(ctx context.Context, name string, args ...string) ([]byte, error) {
	path := filepath.Join(c.bin, name)
	var cmd *exec.Cmd
	if c.runAs != "" {
		cmd = exec.CommandContext(ctx, c.runner, append([]string{"-u", c.runAs, "--", path}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, path, args...)
	}
	cmd.Dir = c.dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return out, nil
}

// pgCtl runs pg_ctl on the cluster, waiting for the action to complete.
func (c *pgCluster) pgCtl(ctx context.Context, action string, args ...string) ([]byte, error) {
	return c.tool(ctx, "pg_ctl", append([]string{action, "-D", c.data, "-w", "-t", "30"}, args...)...)
}

// restart stops the server with fast shutdown (connections are terminated,
// transactions in flight roll back) and starts it again.
func (c *pgCluster) restart(ctx context.Context) error {
	if out, err := c.pgCtl(ctx, "restart", "-m", "fast", "-l", filepath.Join(c.dir, "server.log")); err != nil {
		return fmt.Errorf("%w\n%s\n%s", err, out, c.serverLog())
	}
	return nil
}

// serverLog returns the tail of the server log, for failure messages.
func (c *pgCluster) serverLog() string {
	b, err := os.ReadFile(filepath.Join(c.dir, "server.log"))
	if err != nil {
		return "(no server log: " + err.Error() + ")"
	}
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}
