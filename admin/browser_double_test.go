package admin_test

import (
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/millpond/millpond/admin"
	"github.com/millpond/millpond/outbox"
)

// TestBrowserDoubleClickOnConfirmReportsWhatWasDone: an operator
// double-clicks the confirmation button. The first submission requeues the
// dead letters; the second, whose answer the browser shows, found nothing
// left to do and said "Requeued 0 of 1 … another operator got there first"
// (for a selection) or "409 … Nothing was changed" (for everything
// matching), when the dead letters had been requeued. The page must show
// what was done.
func TestBrowserDoubleClickOnConfirmReportsWhatWasDone(t *testing.T) {
	f := newFixture(t, "sqlite")
	h, err := admin.Handler(f.store, admin.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// Actions run at once, but their answers arrive late, as from a
	// server far away: the second click lands on the confirmation page.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/apply") {
			h.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		time.Sleep(300 * time.Millisecond)
		maps.Copy(w.Header(), rec.Header())
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	}))
	t.Cleanup(srv.Close)
	ctx, _ := tab(t)
	doubleClickConfirm := func() string {
		xy := eval[[]float64](t, ctx, `(() => { const r = document.getElementById('confirm-button').getBoundingClientRect(); return [r.x + r.width/2, r.y + r.height/2]; })()`)
		do(t, ctx, chromedp.MouseClickXY(xy[0], xy[1]))
		time.Sleep(30 * time.Millisecond)
		do(t, ctx, chromedp.MouseClickXY(xy[0], xy[1]), chromedp.WaitVisible(chromedp.CSS("#result-message, #error-message")))
		time.Sleep(500 * time.Millisecond) // a late answer would replace the page
		return eval[string](t, ctx, `document.querySelector('#result-message, #error-message').textContent`)
	}

	do(t, ctx, chromedp.Navigate(srv.URL+"/dead?stream=orders"), chromedp.WaitVisible(chromedp.CSS("#dead-table")),
		chromedp.Click(chromedp.CSS(fmt.Sprintf("#sel-%d", f.deadShipping))),
		chromedp.Click(chromedp.CSS("#requeue-selected")), chromedp.WaitVisible(chromedp.CSS("#confirm-button")))
	if msg := doubleClickConfirm(); msg != "Requeued 1 of 1 dead letters." {
		t.Errorf("selection: the page says %q", msg)
	}
	if got := f.status(f.deadShipping); got != outbox.StatusPending {
		t.Errorf("selection: the dead letter is %s", got)
	}

	do(t, ctx, chromedp.Navigate(srv.URL+"/dead?stream=audit"), chromedp.WaitVisible(chromedp.CSS("#dead-table")),
		chromedp.Click(chromedp.CSS("#requeue-matching")), chromedp.WaitVisible(chromedp.CSS("#confirm-button")))
	if msg := doubleClickConfirm(); msg != "Requeued 1 of 1 dead letters." {
		t.Errorf("everything matching: the page says %q", msg)
	}
	if got := f.status(f.deadDefault); got != outbox.StatusPending {
		t.Errorf("everything matching: the dead letter is %s", got)
	}
}
