package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/millpond/millpond/internal/testdb"
)

// TestAdminMount: /admin/ serves millpond's admin UI, read-only unless
// -admin-actions (or ORDERS_ADMIN_ACTIONS=1) is given, to local requests
// only.
func TestAdminMount(t *testing.T) {
	env := map[string]string{}
	getenv := func(k string) string { return env[k] }
	for _, tc := range []struct {
		args []string
		env  string
		want bool
	}{{nil, "", false}, {nil, "1", true}, {[]string{"-admin-actions"}, "", true}, {[]string{"-admin-actions=false"}, "1", false}} {
		env[envAdminActions] = tc.env
		cfg, err := parseConfig(tc.args, getenv, io.Discard)
		if err != nil || cfg.AdminActions != tc.want {
			t.Errorf("%v with %s=%q: actions %v, %v", tc.args, envAdminActions, tc.env, cfg.AdminActions, err)
		}
	}

	store := testdb.New(t, "sqlite").Store(t)
	for _, actions := range []bool{false, true} {
		h, err := newAdmin(store, actions, zap.NewNop())
		if err != nil {
			t.Fatal(err)
		}
		routes := (&api{store: store, admin: h}).routes()
		req := httptest.NewRequest(http.MethodGet, "http://localhost:8080/admin/dead", nil)
		req.RemoteAddr = "127.0.0.1:5000"
		rec := httptest.NewRecorder()
		routes.ServeHTTP(rec, req)
		body := rec.Body.String()
		if rec.Code != http.StatusOK || strings.Contains(body, "Read-only") == actions {
			t.Errorf("actions %v: GET /admin/dead from loopback: %d, read-only banner %v", actions, rec.Code, strings.Contains(body, "Read-only"))
		}
		req.RemoteAddr = "192.0.2.7:5000"
		rec = httptest.NewRecorder()
		routes.ServeHTTP(rec, req)
		if rec.Code != http.StatusForbidden {
			t.Errorf("GET /admin/dead from another host: %d, want 403", rec.Code)
		}
		// DNS rebinding: a page of an attacker's domain that resolves to
		// this machine asks from loopback, naming its own host.
		req = httptest.NewRequest(http.MethodGet, "http://rebind.attacker.example:8080/admin/dead", nil)
		req.RemoteAddr = "127.0.0.1:5000"
		rec = httptest.NewRecorder()
		routes.ServeHTTP(rec, req)
		if rec.Code != http.StatusMisdirectedRequest {
			t.Errorf("GET /admin/dead from loopback for another host name: %d, want 421", rec.Code)
		}
	}
}
