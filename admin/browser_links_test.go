package admin_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/millpond/millpond/admin"
	"github.com/millpond/millpond/outbox"
)

// TestBrowserLinkFromAnotherSiteKeepsOpenPagesWorking: an operator has the
// dead letters open and follows a link to the UI from another site (a chat
// message, a dashboard). The browser must keep the CSRF cookie it has: when
// that navigation came without it and the UI set a new one, the forms of
// every page already open were refused with "security token out of date".
func TestBrowserLinkFromAnotherSiteKeepsOpenPagesWorking(t *testing.T) {
	f := newFixture(t, "sqlite")
	srv := f.serve(admin.Options{})
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, `<!doctype html><title>chat</title><a id="link" href="%s/">the outbox's admin UI</a>`, srv.URL)
	}))
	t.Cleanup(other.Close)
	// localhost and 127.0.0.1 are different sites to the browser.
	otherURL := strings.Replace(other.URL, "127.0.0.1", "localhost", 1)

	open, _ := tab(t)
	do(t, open, chromedp.Navigate(srv.URL+"/dead?stream=orders"), chromedp.WaitVisible(chromedp.CSS("#dead-table")),
		chromedp.Click(chromedp.CSS(fmt.Sprintf("#sel-%d", f.deadShipping))))
	linked, _ := tab(t)
	do(t, linked, chromedp.Navigate(otherURL), chromedp.WaitVisible(chromedp.CSS("#link")),
		chromedp.Click(chromedp.CSS("#link")), chromedp.WaitVisible(chromedp.CSS("#backlog")))

	do(t, open, chromedp.Click(chromedp.CSS("#requeue-selected")), chromedp.WaitVisible(chromedp.CSS("#confirm-what, #error-message")))
	if msg := eval[string](t, open, `(document.getElementById('error-message') || {}).textContent || ''`); msg != "" {
		t.Fatalf("the page opened before the link was followed: %q", msg)
	}
	do(t, open, chromedp.Click(chromedp.CSS("#confirm-button")), chromedp.WaitVisible(chromedp.CSS("#result-message")))
	if got := f.status(f.deadShipping); got != outbox.StatusPending {
		t.Fatalf("after requeue: %s", got)
	}
}
