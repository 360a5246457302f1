package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"reflect"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"go.uber.org/fx"
	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"

	"github.com/millpond/millpond/admin"
	"github.com/millpond/millpond/bus"
	"github.com/millpond/millpond/fxmodule"
	"github.com/millpond/millpond/outbox"
)

// Input bounds of POST /orders.
const (
	maxCustomerLen = 100
	maxSKULen      = 64
	maxQty         = 1000
	maxBodyBytes   = 64 << 10
)

// api serves the HTTP endpoints.
type api struct {
	domain *Domain
	store  *outbox.Store
	log    *zap.Logger
	admin  http.Handler // millpond's admin UI, at /admin/
	// metrics serves /metrics (Prometheus text), ready /readyz.
	metrics, ready http.Handler
}

func (a *api) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", a.placeOrder)
	mux.HandleFunc("GET /orders/{id}", a.getOrder)
	mux.HandleFunc("POST /orders/{id}/cancel", a.cancelOrder)
	mux.HandleFunc("GET /stock", a.stock)
	mux.HandleFunc("GET /stats", a.stats)
	mux.HandleFunc("GET /healthz", a.healthz)
	mux.Handle("/admin/", a.admin)
	if a.metrics != nil {
		mux.Handle("GET /metrics", a.metrics)
	}
	if a.ready != nil {
		mux.Handle("GET /readyz", a.ready)
	}
	return mux
}

// placeOrderRequest is the body of POST /orders.
type placeOrderRequest struct {
	Customer string `json:"customer"`
	SKU      string `json:"sku"`
	Qty      int    `json:"qty"`
}

// validate checks the request and returns the reason it is invalid.
func (r *placeOrderRequest) validate() error {
	r.Customer = strings.TrimSpace(r.Customer)
	r.SKU = strings.TrimSpace(r.SKU)
	switch {
	case r.Customer == "":
		return errors.New("customer is required")
	case utf8.RuneCountInString(r.Customer) > maxCustomerLen:
		return fmt.Errorf("customer is longer than %d characters", maxCustomerLen)
	case strings.IndexFunc(r.Customer, unicode.IsControl) >= 0:
		return errors.New("customer contains control characters")
	case r.SKU == "":
		return errors.New("sku is required")
	case len(r.SKU) > maxSKULen || strings.IndexFunc(r.SKU, func(c rune) bool {
		return !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.')
	}) >= 0:
		return fmt.Errorf("sku must be 1-%d characters of A-Z, a-z, 0-9, '-', '_' or '.'", maxSKULen)
	case r.Qty < 1 || r.Qty > maxQty:
		return fmt.Errorf("qty must be an integer from 1 to %d", maxQty)
	}
	return nil
}

// jsonReason describes a decoding error of the request body in the
// client's terms: the field and the JSON type it must have, not the
// server's Go types.
func jsonReason(err error) string {
	var typeErr *json.UnmarshalTypeError
	switch {
	case errors.Is(err, io.EOF):
		return "the body is empty"
	case errors.As(err, &typeErr) && typeErr.Field == "":
		return "expected an object"
	case errors.As(err, &typeErr):
		want := "a string"
		if typeErr.Type.Kind() == reflect.Int {
			want = "an integer"
		}
		return typeErr.Field + " must be " + want
	}
	return err.Error()
}

func (a *api) placeOrder(w http.ResponseWriter, r *http.Request) {
	var req placeOrderRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than %d KiB", maxBodyBytes>>10))
			return
		}
		writeError(w, http.StatusBadRequest, "invalid JSON body: "+jsonReason(err))
		return
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		writeError(w, http.StatusBadRequest, "invalid JSON body: unexpected data after the object")
		return
	}
	if err := req.validate(); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	ev, err := a.domain.PlaceOrder(r.Context(), req.Customer, req.SKU, req.Qty)
	if errors.Is(err, ErrUnknownSKU) {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if err != nil {
		a.internalError(w, r, err)
		return
	}
	w.Header().Set("Location", "/orders/"+ev.OrderID)
	writeJSON(w, http.StatusCreated, map[string]string{"id": ev.OrderID, "status": StatusPlaced})
}

// cancelOrder cancels an order: 200 with the order's status at the
// cancellation ("placed" when its reservation was not decided yet, or
// "reserved"), 404 for an unknown id, 409 for an order already cancelled
// or rejected. The stock goes back, and the read model shows "cancelled",
// once the cancellation is handled.
func (a *api) cancelOrder(w http.ResponseWriter, r *http.Request) {
	ev, prior, err := a.domain.CancelOrder(r.Context(), r.PathValue("id"))
	switch {
	case errors.Is(err, ErrOrderNotFound):
		writeError(w, http.StatusNotFound, "order not found")
	case errors.Is(err, ErrAlreadyCancelled), errors.Is(err, ErrOrderRejected):
		writeError(w, http.StatusConflict, err.Error())
	case err != nil:
		a.internalError(w, r, err)
	default:
		writeJSON(w, http.StatusOK, map[string]any{"id": ev.OrderID, "status": StatusCancelled,
			"previous_status": prior, "cancelled_at": ev.CancelledAt})
	}
}

func (a *api) getOrder(w http.ResponseWriter, r *http.Request) {
	v, err := a.domain.GetOrder(r.Context(), r.PathValue("id"))
	if errors.Is(err, ErrOrderNotFound) {
		writeError(w, http.StatusNotFound, "order not found")
		return
	}
	if err != nil {
		a.internalError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func (a *api) stock(w http.ResponseWriter, r *http.Request) {
	levels, err := a.domain.Stock(r.Context())
	if err != nil {
		a.internalError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, levels)
}

// streamStats is outbox.StreamStats as JSON.
type streamStats struct {
	Stream                  string  `json:"stream"`
	Group                   string  `json:"group"`
	Pending                 int64   `json:"pending"`
	Processing              int64   `json:"processing"`
	Dead                    int64   `json:"dead"`
	Blocked                 int64   `json:"blocked"`
	HeldKeys                int64   `json:"held_keys"`
	OldestPendingAgeSeconds float64 `json:"oldest_pending_age_seconds"`
}

func (a *api) stats(w http.ResponseWriter, r *http.Request) {
	stats, err := a.store.Stats(r.Context())
	if err != nil {
		a.internalError(w, r, err)
		return
	}
	out := make([]streamStats, 0, len(stats))
	for _, s := range stats {
		out = append(out, streamStats{
			Stream: s.Stream, Group: s.Group, Pending: s.Pending, Processing: s.Processing, Dead: s.Dead,
			Blocked: s.Blocked, HeldKeys: s.HeldKeys,
			OldestPendingAgeSeconds: s.OldestPendingAge.Seconds(),
		})
	}
	writeJSON(w, http.StatusOK, map[string]any{"streams": out})
}

func (a *api) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := a.domain.Ping(ctx); err != nil {
		a.log.Warn("health check failed", zap.Error(err))
		writeError(w, http.StatusServiceUnavailable, "database unavailable")
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (a *api) internalError(w http.ResponseWriter, r *http.Request, err error) {
	a.log.Error("request failed", zap.String("method", r.Method), zap.String("path", r.URL.Path), zap.Error(err))
	writeError(w, http.StatusInternalServerError, "internal error")
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

// newAdmin mounts millpond's admin UI at /admin/: read-only unless
// actions is set, and answering only requests from the machine itself (the
// service listens on every interface). A real service authenticates its
// operators in Authorize instead.
func newAdmin(store *outbox.Store, actions bool, log *zap.Logger) (http.Handler, error) {
	return admin.Handler(store, admin.Options{
		Prefix:    "/admin",
		ReadOnly:  !actions,
		Authorize: loopbackOnly,
		Logger:    slog.New(zapslog.NewHandler(log.Core(), zapslog.WithName("admin"))),
	})
}

// loopbackOnly refuses requests that do not come from a loopback address.
func loopbackOnly(r *http.Request) error {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
		return errors.New("the admin UI answers local requests only")
	}
	return nil
}

// httpParams are the HTTP server's dependencies. The Bus and the groups are
// among them so that the bus's start hook (which registers the handlers'
// and the groups' consumer groups) runs before the server accepts the first
// order.
type httpParams struct {
	fx.In
	Lifecycle fx.Lifecycle
	Config    config
	Domain    *Domain
	Store     *outbox.Store
	Bus       *bus.Bus
	Logger    *zap.Logger
	Shutdown  fx.Shutdowner
	Metrics   *metricsHandler
	Groups    *orderGroups
	Module    fxmodule.Config
}

// newHTTPServer returns the HTTP server, listening from start to stop.
func newHTTPServer(p httpParams) (*http.Server, error) {
	log := p.Logger.Named("http")
	adminUI, err := newAdmin(p.Store, p.Config.AdminActions, p.Logger)
	if err != nil {
		return nil, fmt.Errorf("orders: admin UI: %w", err)
	}
	a := &api{domain: p.Domain, store: p.Store, log: log, admin: adminUI, metrics: p.Metrics,
		ready: &readiness{bus: p.Bus, store: p.Store, opts: p.Module.Health, groups: p.Groups}}
	srv := &http.Server{
		Addr:              p.Config.Addr,
		Handler:           a.routes(),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          zap.NewStdLog(log),
	}
	p.Lifecycle.Append(fx.Hook{
		OnStart: func(context.Context) error {
			ln, err := net.Listen("tcp", srv.Addr)
			if err != nil {
				return fmt.Errorf("orders: listen on %s: %w", srv.Addr, err)
			}
			log.Info("listening", zap.String("addr", ln.Addr().String()))
			go func() {
				if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
					log.Error("HTTP server failed; stopping", zap.Error(err))
					_ = p.Shutdown.Shutdown(fx.ExitCode(1))
				}
			}()
			return nil
		},
		OnStop: func(ctx context.Context) error {
			if err := srv.Shutdown(ctx); err != nil {
				return fmt.Errorf("orders: shut down HTTP server: %w", err)
			}
			return nil
		},
	})
	return srv, nil
}
