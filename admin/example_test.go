package admin_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"

	"github.com/millpond/millpond/admin"
	"github.com/millpond/millpond/outbox/sqlite"
)

// Mounting the admin UI under /admin of an application's own server,
// read-only, with the application's operator check on every request.
func ExampleHandler() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "millpond-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	store, err := sqlite.Open(ctx, "sqlite:"+filepath.Join(dir, "app.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	h, err := admin.Handler(store, admin.Options{
		Prefix:   "/admin",
		ReadOnly: true, // hide and refuse requeue, reroute, discard and unregister
		Authorize: func(r *http.Request) error {
			if r.Header.Get("X-Operator") == "" { // stands in for a real login
				return admin.ErrUnauthenticated
			}
			return nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/admin/", h) // the full path: no http.StripPrefix

	for _, operator := range []string{"", "ada"} {
		req := httptest.NewRequest(http.MethodGet, "http://localhost/admin/", nil)
		req.Header.Set("X-Operator", operator)
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		fmt.Println(rec.Code)
	}
	// Output:
	// 401
	// 200
}
