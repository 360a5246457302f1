package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// testService is the whole service (newApp) on a test database.
type testService struct {
	base string
	db   *testdb.Database
}

// startService runs the service on a new database of the dialect until the
// test ends. delay is ORDERS_HANDLER_DELAY.
func startService(t *testing.T, dialect string, delay time.Duration) *testService {
	t.Helper()
	db := testdb.New(t, dialect)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	app := newApp(config{Addr: addr, DatabaseURL: db.URL, Lease: 5 * time.Second, HandlerDelay: delay, StatsInterval: 50 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := app.Start(ctx); err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := app.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return &testService{base: "http://" + addr, db: db}
}

// call sends a request and decodes the JSON answer into a map.
func (s *testService) call(t *testing.T, method, path, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, s.base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	var out map[string]any
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatalf("%s %s: %d, not a JSON object: %s", method, path, res.StatusCode, data)
	}
	return res.StatusCode, out
}

func (s *testService) place(t *testing.T, sku string, qty int) string {
	t.Helper()
	code, out := s.call(t, http.MethodPost, "/orders", `{"customer":"ada","sku":"`+sku+`","qty":`+itoa(qty)+`}`)
	id, _ := out["id"].(string)
	if code != http.StatusCreated || id == "" {
		t.Fatalf("place %d %s: %d %v", qty, sku, code, out)
	}
	return id
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// waitStatus waits until the read model shows the order in status.
func (s *testService) waitStatus(t *testing.T, id, status string) map[string]any {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, v := s.call(t, http.MethodGet, "/orders/"+id, "")
		if code == http.StatusOK && v["status"] == status && v["notified"] == true {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("order %s: not %s and notified within 20s: %d %v", id, status, code, v)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *testService) stock(t *testing.T, sku string) int {
	t.Helper()
	res, err := http.Get(s.base + "/stock")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var levels []StockLevel
	if err := json.NewDecoder(res.Body).Decode(&levels); err != nil {
		t.Fatal(err)
	}
	for _, l := range levels {
		if l.SKU == sku {
			return l.Available
		}
	}
	t.Fatalf("no stock of %s: %v", sku, levels)
	return 0
}

// waitDrained waits until no event of the service's stream is undelivered
// or dead.
func (s *testService) waitDrained(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, out := s.call(t, http.MethodGet, "/stats", "")
		streams, _ := out["streams"].([]any)
		busy := code != http.StatusOK
		for _, st := range streams {
			m := st.(map[string]any)
			for _, f := range []string{"pending", "processing", "blocked", "dead"} {
				if m[f].(float64) != 0 {
					busy = true
				}
			}
		}
		if !busy {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("outbox not drained within 20s: %d %v", code, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPlaceAndCancel runs the service on each database: orders placed,
// cancelled before their reservation was decided (the handlers are slowed
// down so that the cancel lands first), cancelled after it, a rejected
// order, and the API's errors. The stock ends exact: what the orders that
// stay reserved hold, every cancelled reservation given back once.
func TestPlaceAndCancel(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			s := startService(t, dialect, 700*time.Millisecond)
			widget, gizmo := s.stock(t, "widget"), s.stock(t, "gizmo")

			// Cancelled at once: the reservation is not decided yet.
			early := s.place(t, "widget", 2)
			code, out := s.call(t, http.MethodPost, "/orders/"+early+"/cancel", "")
			if code != http.StatusOK || out["status"] != StatusCancelled || out["previous_status"] != StatusPlaced || out["id"] != early {
				t.Fatalf("cancel right after placing: %d %v", code, out)
			}
			// Cancelled after its reservation.
			late := s.place(t, "widget", 3)
			s.waitStatus(t, late, StatusReserved)
			code, out = s.call(t, http.MethodPost, "/orders/"+late+"/cancel", "")
			if code != http.StatusOK || out["previous_status"] != StatusReserved {
				t.Fatalf("cancel of a reserved order: %d %v", code, out)
			}
			// Kept.
			kept := s.place(t, "widget", 1)
			// Rejected: more gizmos than there are.
			rejected := s.place(t, "gizmo", gizmo+1)
			s.waitStatus(t, rejected, StatusRejected)

			for _, tc := range []struct {
				id   string
				code int
				err  string
			}{
				{early, http.StatusConflict, ErrAlreadyCancelled.Error()},
				{rejected, http.StatusConflict, ErrOrderRejected.Error()},
				{"no-such-order", http.StatusNotFound, "order not found"},
			} {
				code, out := s.call(t, http.MethodPost, "/orders/"+tc.id+"/cancel", "")
				if code != tc.code || out["error"] != tc.err {
					t.Errorf("cancel %s: %d %v, want %d %q", tc.id, code, out, tc.code, tc.err)
				}
			}

			for _, id := range []string{early, late} {
				if v := s.waitStatus(t, id, StatusCancelled); v["reserved"] != false {
					t.Errorf("cancelled order %s: %v", id, v)
				}
			}
			s.waitStatus(t, kept, StatusReserved)
			s.waitDrained(t)
			if got := s.stock(t, "widget"); got != widget-1 {
				t.Errorf("widget stock: %d, want %d (only the kept order's 1)", got, widget-1)
			}
			if got := s.stock(t, "gizmo"); got != gizmo {
				t.Errorf("gizmo stock: %d, want %d", got, gizmo)
			}
			// The reservation of the early order was taken and given back.
			if n := s.db.Count(t, "SELECT COUNT(*) FROM reservations WHERE order_id IN ('"+early+"', '"+late+"')"); n != 2 {
				t.Errorf("reservations of the cancelled orders: %d, want 2", n)
			}
			if n := s.db.Count(t, "SELECT COALESCE(SUM(qty), 0) FROM releases WHERE order_id IN ('"+early+"', '"+late+"')"); n != 5 {
				t.Errorf("released: %d, want 5", n)
			}
			if n := s.db.Count(t, "SELECT COUNT(*) FROM cancellations WHERE order_id = '"+early+"' AND prior_status = 'placed'"); n != 1 {
				t.Errorf("the early cancellation did not find its order placed")
			}
		})
	}
}

// TestPlaceOrderErrors: the API's answers to invalid orders and ids.
func TestPlaceOrderErrors(t *testing.T) {
	s := startService(t, "sqlite", 0)
	for _, tc := range []struct {
		method, path, body string
		code               int
		err                string
	}{
		{http.MethodPost, "/orders", `{"customer":"ada","sku":"unobtainium","qty":1}`, http.StatusBadRequest, `unknown sku "unobtainium"`},
		{http.MethodPost, "/orders", `{"customer":"ada","sku":"widget","qty":0}`, http.StatusBadRequest, "qty must be an integer from 1 to 1000"},
		{http.MethodPost, "/orders", `{"customer":"ada","sku":"widget","qty":1,"x":1}`, http.StatusBadRequest, `invalid JSON body: json: unknown field "x"`},
		// A client sees the field and what it must be, not the server's Go types.
		{http.MethodPost, "/orders", `{"customer":"ada","sku":"widget","qty":"2"}`, http.StatusBadRequest, "invalid JSON body: qty must be an integer"},
		{http.MethodPost, "/orders", `{"customer":"ada","sku":"widget","qty":2.5}`, http.StatusBadRequest, "invalid JSON body: qty must be an integer"},
		{http.MethodPost, "/orders", `{"customer":7,"sku":"widget","qty":2}`, http.StatusBadRequest, "invalid JSON body: customer must be a string"},
		{http.MethodPost, "/orders", `[]`, http.StatusBadRequest, "invalid JSON body: expected an object"},
		{http.MethodPost, "/orders", ``, http.StatusBadRequest, "invalid JSON body: the body is empty"},
		// A body over the limit is 413, not 400: the client's request is too large, not malformed.
		{http.MethodPost, "/orders", `{"customer":"` + strings.Repeat("a", maxBodyBytes) + `","sku":"widget","qty":1}`, http.StatusRequestEntityTooLarge, "request body larger than 64 KiB"},
		{http.MethodGet, "/orders/no-such-order", "", http.StatusNotFound, "order not found"},
		{http.MethodPost, "/orders/no-such-order/cancel", "", http.StatusNotFound, "order not found"},
	} {
		code, out := s.call(t, tc.method, tc.path, tc.body)
		if code != tc.code || out["error"] != tc.err {
			body := tc.body
			if len(body) > 80 {
				body = body[:80] + "…"
			}
			t.Errorf("%s %s %s: %d %v, want %d %q", tc.method, tc.path, body, code, out, tc.code, tc.err)
		}
	}
}

// TestConcurrentCancels: of many cancellations of one order at once,
// exactly one is accepted; the stock comes back once.
func TestConcurrentCancels(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			s := startService(t, dialect, 0)
			widget := s.stock(t, "widget")
			id := s.place(t, "widget", 4)
			s.waitStatus(t, id, StatusReserved)
			const n = 8
			codes := make([]int, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() { codes[i], _ = s.call(t, http.MethodPost, "/orders/"+id+"/cancel", "") })
			}
			wg.Wait()
			ok := 0
			for _, c := range codes {
				switch c {
				case http.StatusOK:
					ok++
				case http.StatusConflict:
				default:
					t.Errorf("concurrent cancel: %d", c)
				}
			}
			if ok != 1 {
				t.Errorf("%d of %d concurrent cancels accepted, want 1 (%v)", ok, n, codes)
			}
			s.waitStatus(t, id, StatusCancelled)
			s.waitDrained(t)
			if got := s.stock(t, "widget"); got != widget {
				t.Errorf("widget stock: %d, want %d", got, widget)
			}
		})
	}
}

// newTestDomain returns a Domain on a new, migrated database of the
// dialect, without the service around it.
func newTestDomain(t *testing.T, dialect string) *Domain {
	t.Helper()
	store := testdb.New(t, dialect).Store(t)
	pub, err := outbox.NewContextPublisher(store)
	if err != nil {
		t.Fatal(err)
	}
	d := &Domain{db: store.SQLDB(), dialect: store.Dialect(), store: store, publisher: pub, log: zap.NewNop()}
	if err := d.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestOutOfOrderIsRefused: the handlers rely on the order of an order's
// events and say so when it is broken, rather than apply an event to a
// state it does not follow: a release of an order not decided yet, a
// read-model change of an order it has no row for or of a state the event
// does not follow.
func TestOutOfOrderIsRefused(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			d := newTestDomain(t, dialect)
			ev, err := d.PlaceOrder(ctx, "ada", "widget", 2)
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := d.CancelOrder(ctx, ev.OrderID); err != nil {
				t.Fatal(err)
			}
			if _, _, err := d.Release(ctx, ev.OrderID, nil); !errors.Is(err, ErrOutOfOrder) {
				t.Errorf("release before the reservation: %v, want ErrOutOfOrder", err)
			}
			for _, kind := range []string{KindOrderReserved, KindStockReleased, KindCustomerNotified} {
				if err := d.UpdateView(ctx, kind, ev.OrderID, nil); !errors.Is(err, ErrOutOfOrder) {
					t.Errorf("%s before OrderPlaced: %v, want ErrOutOfOrder", kind, err)
				}
			}
			if err := d.UpdateView(ctx, KindOrderPlaced, ev.OrderID, nil); err != nil {
				t.Fatal(err)
			}
			if err := d.UpdateView(ctx, KindStockReleased, ev.OrderID, nil); !errors.Is(err, ErrOutOfOrder) {
				t.Errorf("StockReleased before the reservation: %v, want ErrOutOfOrder", err)
			}
			// In order, each event applies once.
			if decided, err := d.Reserve(ctx, ev.OrderID, nil); err != nil || decided != StatusReserved {
				t.Fatalf("reserve: %q %v", decided, err)
			}
			for _, kind := range []string{KindOrderReserved, KindCustomerNotified, KindStockReleased} {
				if err := d.UpdateView(ctx, kind, ev.OrderID, nil); err != nil {
					t.Fatalf("%s in order: %v", kind, err)
				}
				if err := d.UpdateView(ctx, kind, ev.OrderID, nil); !errors.Is(err, ErrOutOfOrder) {
					t.Errorf("%s twice: %v, want ErrOutOfOrder", kind, err)
				}
			}
			if qty, released, err := d.Release(ctx, ev.OrderID, nil); err != nil || !released || qty != 2 {
				t.Fatalf("release: %d %v %v", qty, released, err)
			}
			if _, released, err := d.Release(ctx, ev.OrderID, nil); err != nil || released {
				t.Errorf("second release: released %v, %v", released, err)
			}
			v, err := d.GetOrder(ctx, ev.OrderID)
			if err != nil || v.Status != StatusCancelled || v.Reserved || !v.Notified {
				t.Errorf("order view: %+v %v", v, err)
			}
		})
	}
}
