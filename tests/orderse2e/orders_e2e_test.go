//go:build unix

// Package orderse2e runs the example order service (examples/orders) as a
// real process against real databases, kills it with SIGKILL while its
// handlers are working, restarts it on the same database and checks that
// every order reached its final state exactly once.
package orderse2e

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/millpond/millpond/internal/testdb"
)

const (
	numOrders    = 200
	placeWorkers = 16
	// handlerDelay slows every handler so that the kill lands while events
	// are being handled.
	handlerDelay = "40ms"
	// lease is short so that the restarted process reclaims the killed
	// process's events quickly.
	lease = "2s"
)

var skus = []string{"widget", "gadget", "gizmo"}

// TestOrdersKillAndRestart places orders over HTTP, SIGKILLs the service
// mid-handling, restarts it and checks the outcome exactly.
func TestOrdersKillAndRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test builds and runs the example service")
	}
	bin := buildExample(t)
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			runKillAndRestart(t, bin, dialect)
		})
	}
}

// buildExample builds examples/orders into the test's temporary directory.
func buildExample(t *testing.T) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to build the example: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "orders")
	start := time.Now()
	out, err := exec.Command(goTool, "build", "-o", bin, "github.com/millpond/millpond/examples/orders").CombinedOutput()
	if err != nil {
		t.Fatalf("go build examples/orders: %v\n%s", err, out)
	}
	t.Logf("built examples/orders in %s", time.Since(start).Round(time.Millisecond))
	return bin
}

type placed struct {
	id  string
	sku string
	qty int
}

func runKillAndRestart(t *testing.T, bin, dialect string) {
	started := time.Now()
	db := testdb.New(t, dialect)
	sqlDB := db.SQL
	if db.Pool != nil {
		sqlDB = stdlib.OpenDBFromPool(db.Pool)
		t.Cleanup(func() { sqlDB.Close() })
	}
	addr := freeAddr(t)
	base := "http://" + addr
	logPath := filepath.Join(t.TempDir(), "orders.log")
	t.Cleanup(func() {
		if t.Failed() {
			dumpLog(t, logPath)
		}
	})

	// First run: place the orders, then kill the process mid-handling.
	first := startService(t, bin, db.URL, addr, logPath)
	initialStock := getStock(t, base)
	orders := placeOrders(t, base)
	t.Logf("%s: placed %d orders in %s", dialect, len(orders), time.Since(started).Round(time.Millisecond))

	var atKill []streamStats
	deadline := time.Now().Add(20 * time.Second)
	for {
		atKill = getStats(t, base)
		if total(atKill, func(s streamStats) int64 { return s.Processing }) > 0 {
			break
		}
		if total(atKill, func(s streamStats) int64 { return s.Pending }) == 0 {
			t.Fatalf("every event was handled before the kill; nothing was killed mid-handling: %+v", atKill)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no event was being handled within 20s: %+v", atKill)
		}
		time.Sleep(5 * time.Millisecond)
	}
	first.kill(t)
	finalAtKill := countFinal(t, sqlDB)
	t.Logf("%s: SIGKILL with %d events processing and %d pending; %d/%d orders final at the kill",
		dialect, total(atKill, func(s streamStats) int64 { return s.Processing }),
		total(atKill, func(s streamStats) int64 { return s.Pending }), finalAtKill, numOrders)

	// Second run on the same database: everything must settle.
	restarted := time.Now()
	second := startService(t, bin, db.URL, addr, logPath)
	deadline = time.Now().Add(40 * time.Second)
	for {
		stats := getStats(t, base)
		undelivered := total(stats, func(s streamStats) int64 { return s.Pending + s.Processing + s.Dead })
		if undelivered == 0 && countFinal(t, sqlDB) == numOrders {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not settled within 40s of the restart: %d/%d orders final, outbox %+v", countFinal(t, sqlDB), numOrders, stats)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("%s: settled %s after the restart (lease %s)", dialect, time.Since(restarted).Round(time.Millisecond), lease)

	// Every order, through the API.
	reservedQty := map[string]int{}
	var reserved, rejected []placed
	for _, o := range orders {
		v := getOrder(t, base, o.id)
		switch {
		case !v.Notified:
			t.Errorf("order %s: not notified: %+v", o.id, v)
		case v.Status == "reserved" && v.Reserved:
			reserved = append(reserved, o)
			reservedQty[o.sku] += o.qty
		case v.Status == "rejected" && !v.Reserved:
			rejected = append(rejected, o)
		default:
			t.Errorf("order %s: not in a final state: %+v", o.id, v)
		}
		if v.SKU != o.sku || v.Qty != o.qty {
			t.Errorf("order %s: got %s x %d, placed %s x %d", o.id, v.SKU, v.Qty, o.sku, o.qty)
		}
	}

	// The database: exactly one effect per order.
	expectCount(t, sqlDB, "orders", "SELECT COUNT(*) FROM orders", numOrders)
	expectCount(t, sqlDB, "order_view rows", "SELECT COUNT(*) FROM order_view", numOrders)
	expectCount(t, sqlDB, "notifications", "SELECT COUNT(*) FROM notifications", numOrders)
	expectCount(t, sqlDB, "orders notified", "SELECT COUNT(DISTINCT n.order_id) FROM notifications n JOIN orders o ON o.id = n.order_id", numOrders)
	expectCount(t, sqlDB, "reservations", "SELECT COUNT(*) FROM reservations", int64(len(reserved)))
	expectCount(t, sqlDB, "reservations of reserved orders with the order's sku and qty",
		"SELECT COUNT(*) FROM reservations r JOIN orders o ON o.id = r.order_id WHERE o.status = 'reserved' AND r.sku = o.sku AND r.qty = o.qty", int64(len(reserved)))
	expectCount(t, sqlDB, "orders whose status differs from the read model",
		"SELECT COUNT(*) FROM orders o JOIN order_view v ON v.order_id = o.id WHERE o.status <> v.status", 0)

	finalStock := getStock(t, base)
	for _, sku := range skus {
		if got, want := initialStock[sku]-finalStock[sku], reservedQty[sku]; got != want {
			t.Errorf("stock of %s fell by %d, want the %d reserved (from %d to %d)", sku, got, want, initialStock[sku], finalStock[sku])
		}
	}
	for _, o := range rejected {
		// Stock only falls, so a rightly rejected order still cannot be met.
		if finalStock[o.sku] >= o.qty {
			t.Errorf("order %s for %d %s was rejected but %d are still available", o.id, o.qty, o.sku, finalStock[o.sku])
		}
	}
	for _, s := range getStats(t, base) {
		if s.Pending != 0 || s.Processing != 0 || s.Dead != 0 {
			t.Errorf("outbox not drained: %+v", s)
		}
	}

	redelivered := countRows(t, sqlDB, "SELECT COUNT(*) FROM millpond_outbox WHERE attempts > 1")
	if redelivered == 0 {
		t.Errorf("no event was delivered more than once; the kill did not interrupt any claim")
	}
	second.stop(t)
	log := readFile(t, logPath)
	ignored := strings.Count(log, "redelivery ignored")
	t.Logf("%s: %d reserved, %d rejected; %d outbox rows delivered more than once, %d redeliveries found already handled; total %s",
		dialect, len(reserved), len(rejected), redelivered, ignored, time.Since(started).Round(time.Millisecond))
	if errs := errorLines(log); len(errs) > 0 {
		t.Logf("%s: %d error lines in the service log, e.g.:\n%s", dialect, len(errs), strings.Join(errs[:min(len(errs), 5)], "\n"))
	}
}

// errorLines returns the service's error-level log lines.
func errorLines(log string) []string {
	var out []string
	for line := range strings.Lines(log) {
		if strings.Contains(line, `"level":"error"`) {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return out
}

// service is one running example process.
type service struct {
	cmd  *exec.Cmd
	done chan error
}

func startService(t *testing.T, bin, dbURL, addr, logPath string) *service {
	t.Helper()
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command(bin, "-addr", addr, "-db", dbURL, "-lease", lease)
	cmd.Env = append(os.Environ(), "ORDERS_HANDLER_DELAY="+handlerDelay)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	s := &service{cmd: cmd, done: make(chan error, 1)}
	go func() { s.done <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-s.done
		}
	})

	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case err := <-s.done:
			s.done <- err
			t.Fatalf("service exited during start: %v", err)
		default:
		}
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("service not healthy within 30s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill ends the process with SIGKILL: no graceful stop, no release, no
// pending acks written.
func (s *service) kill(t *testing.T) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL: %v", err)
	}
	<-s.done
}

// stop ends the process with SIGTERM and expects a clean exit.
func (s *service) stop(t *testing.T) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	select {
	case err := <-s.done:
		if err != nil {
			t.Errorf("service did not stop cleanly on SIGTERM: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Errorf("service did not stop within 20s of SIGTERM")
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

var client = &http.Client{Timeout: 15 * time.Second}

func placeOrders(t *testing.T, base string) []placed {
	t.Helper()
	jobs := make(chan int)
	out := make([]placed, numOrders)
	errs := make(chan error, numOrders)
	var wg sync.WaitGroup
	for range placeWorkers {
		wg.Go(func() {
			for i := range jobs {
				sku, qty := skus[i%len(skus)], 1+rand.IntN(3)
				body, _ := json.Marshal(map[string]any{"customer": fmt.Sprintf("customer-%d", i), "sku": sku, "qty": qty})
				resp, err := client.Post(base+"/orders", "application/json", bytes.NewReader(body))
				if err != nil {
					errs <- fmt.Errorf("order %d: %w", i, err)
					continue
				}
				var res struct{ ID string }
				data, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusCreated || json.Unmarshal(data, &res) != nil || res.ID == "" {
					errs <- fmt.Errorf("order %d: %s: %s", i, resp.Status, data)
					continue
				}
				out[i] = placed{id: res.ID, sku: sku, qty: qty}
			}
		})
	}
	for i := range numOrders {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("place order: %v", err)
	}
	return out
}

type orderView struct {
	ID       string `json:"id"`
	SKU      string `json:"sku"`
	Qty      int    `json:"qty"`
	Status   string `json:"status"`
	Reserved bool   `json:"reserved"`
	Notified bool   `json:"notified"`
}

func getOrder(t *testing.T, base, id string) orderView {
	t.Helper()
	var v orderView
	getJSON(t, base+"/orders/"+id, &v)
	return v
}

type streamStats struct {
	Stream     string `json:"stream"`
	Group      string `json:"group"`
	Pending    int64  `json:"pending"`
	Processing int64  `json:"processing"`
	Dead       int64  `json:"dead"`
}

func getStats(t *testing.T, base string) []streamStats {
	t.Helper()
	var v struct{ Streams []streamStats }
	getJSON(t, base+"/stats", &v)
	return v.Streams
}

func total(stats []streamStats, f func(streamStats) int64) int64 {
	var n int64
	for _, s := range stats {
		n += f(s)
	}
	return n
}

func getStock(t *testing.T, base string) map[string]int {
	t.Helper()
	var levels []struct {
		SKU       string
		Available int
	}
	getJSON(t, base+"/stock", &levels)
	out := map[string]int{}
	for _, l := range levels {
		out[l.SKU] = l.Available
	}
	for _, sku := range skus {
		if _, ok := out[sku]; !ok {
			t.Fatalf("no stock of %s: %v", sku, out)
		}
	}
	return out
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s: %s", url, resp.Status, data)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("GET %s: decode %s: %v", url, data, err)
	}
}

// countFinal counts orders whose read model shows their final state.
func countFinal(t *testing.T, db *sql.DB) int64 {
	t.Helper()
	return countRows(t, db, "SELECT COUNT(*) FROM order_view WHERE notified AND status IN ('reserved', 'rejected') AND reserved = (status = 'reserved')")
}

func countRows(t *testing.T, db *sql.DB, query string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int64
	if err := db.QueryRowContext(ctx, query).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

func expectCount(t *testing.T, db *sql.DB, what, query string, want int64) {
	t.Helper()
	if got := countRows(t, db, query); got != want {
		t.Errorf("%s: got %d, want %d", what, got, want)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func dumpLog(t *testing.T, path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		return
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) > 60 {
		lines = lines[len(lines)-60:]
	}
	t.Logf("last lines of the service log:\n%s", strings.Join(lines, "\n"))
}
