//go:build unix

// Package orderse2e runs the example order service (examples/orders) as a
// real process against real databases, places orders and cancels a share of
// them (some at once, before their reservation is decided), kills it with
// SIGKILL while its handlers are working, restarts it on the same database,
// cancels more while it catches up, and checks that every order reached its
// final state exactly once and the stock is exact.
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
	numOrders    = 240
	placeWorkers = 16
	// Every earlyCancelEvery-th order is cancelled right after it is
	// placed, mostly before its reservation is decided; every
	// lateCancelEvery-th (offset by one) right after the restart, while the
	// restarted process catches up, and as many (offset by five) once half
	// the orders are final, mostly after their reservation.
	earlyCancelEvery = 4
	lateCancelEvery  = 8
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

// Outcomes of an order's cancellation.
const (
	notCancelled   = iota
	cancelAccepted // 200
	cancelRefused  // 409: the order was rejected
)

type placed struct {
	id     string
	sku    string
	qty    int
	cancel int // notCancelled, cancelAccepted or cancelRefused
}

func countCancels(orders []placed) int {
	n := 0
	for _, o := range orders {
		if o.cancel == cancelAccepted {
			n++
		}
	}
	return n
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

	// First run: place the orders, cancel some at once, then kill the
	// process mid-handling.
	first := startService(t, bin, db.URL, addr, logPath)
	initialStock := getStock(t, base)
	orders := placeOrders(t, base)
	t.Logf("%s: placed %d orders (%d cancelled at once) in %s", dialect, len(orders), countCancels(orders), time.Since(started).Round(time.Millisecond))

	var atKill []streamStats
	deadline := time.Now().Add(20 * time.Second)
	for {
		atKill = getStats(t, base)
		if total(atKill, func(s streamStats) int64 { return s.Processing }) > 0 {
			break
		}
		if total(atKill, func(s streamStats) int64 { return s.Pending + s.Blocked }) == 0 {
			t.Fatalf("every event was handled before the kill; nothing was killed mid-handling: %+v", atKill)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no event was being handled within 20s: %+v", atKill)
		}
		time.Sleep(5 * time.Millisecond)
	}
	first.kill(t)
	finalAtKill := countFinal(t, sqlDB)
	t.Logf("%s: SIGKILL with %d events processing, %d pending and %d blocked; %d/%d orders final at the kill",
		dialect, total(atKill, func(s streamStats) int64 { return s.Processing }),
		total(atKill, func(s streamStats) int64 { return s.Pending }),
		total(atKill, func(s streamStats) int64 { return s.Blocked }), finalAtKill, numOrders)

	// Second run on the same database: cancel more while it catches up,
	// then everything must settle.
	restarted := time.Now()
	second := startService(t, bin, db.URL, addr, logPath)
	cancelLate(t, base, orders, 1)
	for deadline := time.Now().Add(30 * time.Second); countFinal(t, sqlDB) < numOrders/2; {
		if time.Now().After(deadline) {
			t.Fatalf("not half the orders final within 30s of the restart: %d/%d", countFinal(t, sqlDB), numOrders)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancelLate(t, base, orders, 5)
	deadline = time.Now().Add(60 * time.Second)
	for {
		stats := getStats(t, base)
		undelivered := total(stats, func(s streamStats) int64 { return s.Pending + s.Processing + s.Blocked + s.Dead })
		if undelivered == 0 && countFinal(t, sqlDB) == numOrders {
			break
		}
		// Dead letters, and the events of their orders they hold, stay.
		if dead := total(stats, func(s streamStats) int64 { return s.Dead }); dead > 0 && total(stats, func(s streamStats) int64 { return s.Pending + s.Processing }) == 0 {
			t.Errorf("%d events dead-lettered: %+v", dead, stats)
			break // check the rest, and report what the dead letters left undone
		}
		if time.Now().After(deadline) {
			t.Fatalf("not settled within 60s of the restart: %d/%d orders final, outbox %+v", countFinal(t, sqlDB), numOrders, stats)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !t.Failed() {
		t.Logf("%s: settled %s after the restart (lease %s)", dialect, time.Since(restarted).Round(time.Millisecond), lease)
	}

	// Every order, through the API.
	keptQty := map[string]int{}
	var kept, rejected, cancelled []placed
	for _, o := range orders {
		v := getOrder(t, base, o.id)
		if !v.Notified {
			t.Errorf("order %s: not notified: %+v", o.id, v)
		}
		switch {
		case o.cancel == cancelAccepted:
			if v.Status != "cancelled" || v.Reserved {
				t.Errorf("order %s: cancelled, but the read model shows %+v", o.id, v)
			}
			cancelled = append(cancelled, o)
		case o.cancel == cancelRefused && (v.Status != "rejected" || v.Reserved):
			t.Errorf("order %s: its cancellation was refused as rejected, but the read model shows %+v", o.id, v)
		case v.Status == "reserved" && v.Reserved:
			kept = append(kept, o)
			keptQty[o.sku] += o.qty
		case v.Status == "rejected" && !v.Reserved:
			rejected = append(rejected, o)
		default:
			t.Errorf("order %s (cancel %d): not in a final state: %+v", o.id, o.cancel, v)
		}
		if v.SKU != o.sku || v.Qty != o.qty {
			t.Errorf("order %s: got %s x %d, placed %s x %d", o.id, v.SKU, v.Qty, o.sku, o.qty)
		}
	}

	// The database: exactly one effect per event.
	expectCount(t, sqlDB, "orders", "SELECT COUNT(*) FROM orders", numOrders)
	expectCount(t, sqlDB, "order_view rows", "SELECT COUNT(*) FROM order_view", numOrders)
	expectCount(t, sqlDB, "notifications", "SELECT COUNT(*) FROM notifications", numOrders)
	expectCount(t, sqlDB, "orders notified", "SELECT COUNT(DISTINCT n.order_id) FROM notifications n JOIN orders o ON o.id = n.order_id", numOrders)
	reservedOrders := countRows(t, sqlDB, "SELECT COUNT(*) FROM orders WHERE status = 'reserved'")
	expectCount(t, sqlDB, "reservations (one per reserved order, cancelled or not)", "SELECT COUNT(*) FROM reservations", reservedOrders)
	expectCount(t, sqlDB, "reservations of reserved orders with the order's sku and qty",
		"SELECT COUNT(*) FROM reservations r JOIN orders o ON o.id = r.order_id WHERE o.status = 'reserved' AND r.sku = o.sku AND r.qty = o.qty", reservedOrders)
	expectCount(t, sqlDB, "cancellations", "SELECT COUNT(*) FROM cancellations", int64(len(cancelled)))
	expectCount(t, sqlDB, "releases (one per cancellation)", "SELECT COUNT(*) FROM releases r JOIN cancellations c ON c.order_id = r.order_id", int64(len(cancelled)))
	expectCount(t, sqlDB, "releases that gave back other than the reservation (or 0 for a rejected order)",
		"SELECT COUNT(*) FROM releases r JOIN orders o ON o.id = r.order_id LEFT JOIN reservations s ON s.order_id = r.order_id WHERE r.qty <> COALESCE(s.qty, 0) OR (o.status = 'reserved') <> (s.order_id IS NOT NULL)", 0)
	expectCount(t, sqlDB, "orders whose read-model status differs from the write model",
		"SELECT COUNT(*) FROM orders o JOIN order_view v ON v.order_id = o.id LEFT JOIN cancellations c ON c.order_id = o.id "+
			"WHERE v.status <> CASE WHEN c.order_id IS NOT NULL THEN 'cancelled' ELSE o.status END", 0)
	beforeDecision := countRows(t, sqlDB, "SELECT COUNT(*) FROM cancellations WHERE prior_status = 'placed'")
	if beforeDecision == 0 {
		t.Errorf("no cancellation was committed before its order's reservation was decided; the test did not exercise the ordering")
	}
	releasedReserved := countRows(t, sqlDB, "SELECT COUNT(*) FROM cancellations c JOIN orders o ON o.id = c.order_id WHERE c.prior_status = 'placed' AND o.status = 'reserved'")
	afterDecision := countRows(t, sqlDB, "SELECT COUNT(*) FROM cancellations WHERE prior_status = 'reserved'")
	if releasedReserved == 0 || afterDecision == 0 {
		t.Errorf("cancellations before the reservation and then reserved: %d, after the reservation: %d; want some of each", releasedReserved, afterDecision)
	}

	finalStock := getStock(t, base)
	for _, sku := range skus {
		if got, want := initialStock[sku]-finalStock[sku], keptQty[sku]; got != want {
			t.Errorf("stock of %s fell by %d, want the %d the orders still reserved hold (from %d to %d)", sku, got, want, initialStock[sku], finalStock[sku])
		}
	}
	for _, s := range getStats(t, base) {
		if s.Pending != 0 || s.Processing != 0 || s.Blocked != 0 || s.Dead != 0 {
			t.Errorf("outbox not drained: %+v", s)
		}
	}

	redelivered := countRows(t, sqlDB, "SELECT COUNT(*) FROM millpond_outbox WHERE attempts > 1")
	if redelivered == 0 {
		t.Errorf("no event was delivered more than once; the kill did not interrupt any claim")
	}
	second.stop(t)
	log := readFile(t, logPath)
	// The ordered groups acknowledge inside their transaction: a delivery
	// after its effect committed would be a defect, and these warnings say so.
	for _, w := range []string{"order already decided; redelivery ignored", "cancellation already handled; redelivery ignored"} {
		if n := strings.Count(log, w); n > 0 {
			t.Errorf("%d times %q: an event of an ordered group was handled after its effect committed", n, w)
		}
	}
	ignored := strings.Count(log, "customer already notified; redelivery ignored")
	t.Logf("%s: %d kept, %d rejected, %d cancelled (%d before their reservation was decided, %d of those then reserved and given back, %d after); "+
		"%d outbox rows delivered more than once, %d notify redeliveries found already handled; total %s",
		dialect, len(kept), len(rejected), len(cancelled), beforeDecision, releasedReserved, afterDecision, redelivered, ignored, time.Since(started).Round(time.Millisecond))
	if errs := errorLines(log); len(errs) > 0 {
		t.Logf("%s: %d error lines in the service log, e.g.:\n%s", dialect, len(errs), strings.Join(errs[:min(len(errs), 5)], "\n"))
		// The log must not lose the reason of a failure: every error line of
		// an ordered group is listed (none is expected).
		var outOfOrder []string
		for _, e := range errs {
			if strings.Contains(e, "out of order") {
				outOfOrder = append(outOfOrder, e)
			}
		}
		if len(outOfOrder) > 0 {
			t.Errorf("%s: %d events were refused as out of order, e.g.:\n%s", dialect, len(outOfOrder), strings.Join(outOfOrder[:min(len(outOfOrder), 3)], "\n"))
		}
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
				if i%earlyCancelEvery == 0 {
					code, err := cancelOrder(base, res.ID)
					if err != nil {
						errs <- fmt.Errorf("order %d: cancel: %w", i, err)
						continue
					}
					out[i].cancel = code
				}
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

// cancelOrder cancels an order and returns cancelAccepted or
// cancelRefused (the order was rejected); any other answer is an error.
func cancelOrder(base, id string) (int, error) {
	resp, err := client.Post(base+"/orders/"+id+"/cancel", "application/json", nil)
	if err != nil {
		return 0, err
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusOK:
		return cancelAccepted, nil
	case resp.StatusCode == http.StatusConflict && strings.Contains(string(data), "rejected"):
		return cancelRefused, nil
	default:
		return 0, fmt.Errorf("%s: %s", resp.Status, data)
	}
}

// cancelLate cancels every lateCancelEvery-th order from offset on (not
// one of the early cancellations) from several goroutines at once.
func cancelLate(t *testing.T, base string, orders []placed, offset int) {
	t.Helper()
	jobs := make(chan int)
	errs := make(chan error, len(orders))
	var wg sync.WaitGroup
	for range placeWorkers {
		wg.Go(func() {
			for i := range jobs {
				code, err := cancelOrder(base, orders[i].id)
				if err != nil {
					errs <- fmt.Errorf("order %d: late cancel: %w", i, err)
					continue
				}
				orders[i].cancel = code
			}
		})
	}
	for i := range orders {
		if i%lateCancelEvery == offset {
			jobs <- i
		}
	}
	close(jobs)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("%v", err)
	}
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
	Blocked    int64  `json:"blocked"`
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

// countFinal counts orders whose read model shows a final state (a
// cancellation not handled yet is still in the outbox).
func countFinal(t *testing.T, db *sql.DB) int64 {
	t.Helper()
	return countRows(t, db, "SELECT COUNT(*) FROM order_view WHERE notified AND status IN ('reserved', 'rejected', 'cancelled') AND reserved = (status = 'reserved')")
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
