package admin_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/millpond/millpond/admin"
)

// TestBrowserConsoleIsClean loads every page, the way an operator's
// browser does (favicon included), and expects nothing in the console: no
// script error, no resource that failed to load, no refused by the
// Content-Security-Policy.
func TestBrowserConsoleIsClean(t *testing.T) {
	f := newFixture(t, "sqlite")
	srv := f.serve(admin.Options{RefreshInterval: 200 * time.Millisecond})
	ctx, _ := tab(t)
	var mu sync.Mutex
	var entries []string
	add := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		entries = append(entries, s)
	}
	go func() {
		for e, err := range chromedp.Events(ctx, cdplog.EntryAdded) {
			if err != nil {
				return
			}
			add(fmt.Sprintf("%s: %s (%s)", e.Entry.Level, e.Entry.Text, e.Entry.URL))
		}
	}()
	go func() {
		for e, err := range chromedp.Events(ctx, runtime.ExceptionThrown) {
			if err != nil {
				return
			}
			add("exception: " + e.ExceptionDetails.Text)
		}
	}()
	if _, err := chromedp.Call(ctx, cdplog.Enable, cdp.Empty{}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctx, runtime.Enable, cdp.Empty{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/", "/dead", fmt.Sprintf("/events/%d", f.deadShipping), fmt.Sprintf("/events/%d", f.deadDefault),
		"/lookup?stream=orders&key=order-1", "/groups"} {
		do(t, ctx, chromedp.Navigate(srv.URL+p), chromedp.WaitVisible(chromedp.CSS("footer")))
		time.Sleep(700 * time.Millisecond) // the favicon, and refreshes of the overview
	}
	mu.Lock()
	defer mu.Unlock()
	for _, e := range entries {
		t.Errorf("console: %s", e)
	}
}
