package admin_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/millpond/millpond/admin"
	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// The browser tests drive the system's headless Chromium (Debian's chromium
// package) through the DevTools protocol. One browser serves the whole
// package; each test opens its own tab. Without Chromium they are skipped
// with the reason, or fail when MILLPOND_REQUIRE_DATABASES=1 (CI).

var browser struct {
	once   sync.Once
	ctx    context.Context
	cancel func()
	err    error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if browser.cancel != nil {
		browser.cancel()
	}
	os.Exit(code)
}

// chromiumPath finds the browser: $MILLPOND_CHROMIUM, Debian's
// /usr/bin/chromium, or chromium on PATH.
func chromiumPath() string {
	for _, p := range []string{os.Getenv("MILLPOND_CHROMIUM"), "/usr/bin/chromium"} {
		if p != "" {
			if _, err := os.Stat(p); err == nil {
				return p
			}
		}
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

func startBrowser() {
	path := chromiumPath()
	if path == "" {
		browser.err = errors.New("no Chromium found (install Debian's chromium package, or set MILLPOND_CHROMIUM)")
		return
	}
	dir, err := os.MkdirTemp("", "millpond-admin-chromium-")
	if err != nil {
		browser.err = err
		return
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(dir),
		chromedp.WindowSize(1280, 900),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(allocCtx)
	browser.ctx = ctx
	browser.cancel = func() {
		cancelCtx()
		cancelAlloc()
		os.RemoveAll(dir)
	}
	// Start it now, without a timeout on this first call (it owns the
	// browser's lifetime).
	if err := chromedp.Do(ctx); err != nil {
		browser.err = fmt.Errorf("start %s: %w", path, err)
	}
}

// tab opens a new tab of the shared browser, closed when the test ends. It
// records every JavaScript dialog (alert, confirm, prompt) in dialogs and
// dismisses it.
func tab(t *testing.T) (ctx context.Context, dialogs *atomic.Int64) {
	t.Helper()
	browser.once.Do(startBrowser)
	if browser.err != nil {
		if testdb.Required() {
			t.Fatalf("browser unavailable (%v), and MILLPOND_REQUIRE_DATABASES=1 forbids skipping", browser.err)
		}
		t.Skipf("browser unavailable: %v", browser.err)
	}
	tabCtx, cancelTab := chromedp.NewContext(browser.ctx)
	ctx, cancel := context.WithTimeout(tabCtx, 60*time.Second)
	t.Cleanup(func() { cancel(); cancelTab() })
	dialogs = new(atomic.Int64)
	events := chromedp.Events(ctx, page.JavascriptDialogOpening)
	go func() {
		for _, err := range events {
			if err != nil {
				return
			}
			dialogs.Add(1)
			_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: false})
		}
	}()
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1280, 900)); err != nil {
		t.Fatal(err)
	}
	return ctx, dialogs
}

// screenshotDirs holds each test's screenshot directory.
var screenshotDirs sync.Map

// screenshot saves a full-page PNG of the tab as name.png in
// $MILLPOND_SCREENSHOTS, or in the test's temporary directory.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("MILLPOND_SCREENSHOTS")
	if dir == "" {
		d, _ := screenshotDirs.LoadOrStore(t, filepath.Join(t.TempDir(), "screenshots"))
		dir = d.(string)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	path := filepath.Join(dir, name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
}

func do(t *testing.T, ctx context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatal(err)
	}
}

func eval[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("evaluate %s: %v", js, err)
	}
	return v
}

// gridRow is one row of the overview as the browser shows it.
type gridRow struct {
	Stream, Group                       string
	Pending, Processing, Retrying, Dead int64
}

const readGrid = `Array.from(document.querySelectorAll('#backlog tbody tr[data-stream]')).map(r => ({
  Stream: r.dataset.stream, Group: r.dataset.group,
  Pending: +r.querySelector('[data-col=pending]').textContent,
  Processing: +r.querySelector('[data-col=processing]').textContent,
  Retrying: +r.querySelector('[data-col=retrying]').textContent,
  Dead: +r.querySelector('[data-col=dead]').textContent.replace(/[^0-9]/g, ''),
}))`

// TestBrowserOverviewMatchesDatabase loads the overview on every dialect and
// compares each cell with counts read from the table with SQL; then it adds
// an event and waits for the grid to refresh itself.
func TestBrowserOverviewMatchesDatabase(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			f := newFixture(t, dialect)
			srv := f.serve(admin.Options{Prefix: "/admin", RefreshInterval: 300 * time.Millisecond})
			ctx, dialogs := tab(t)
			do(t, ctx, chromedp.Navigate(srv.URL+"/admin/"), chromedp.WaitVisible(chromedp.CSS("#backlog")))
			rows := eval[[]gridRow](t, ctx, readGrid)
			want := []gridRow{
				{Stream: "audit", Group: "", Pending: 1, Dead: 1},
				{Stream: "orders", Group: "billing", Pending: 1, Processing: 1},
				{Stream: "orders", Group: "shipping", Pending: 2, Retrying: 1, Dead: 1},
			}
			if fmt.Sprint(rows) != fmt.Sprint(want) {
				t.Fatalf("grid: got %+v, want %+v", rows, want)
			}
			q := func(sql string) string {
				if dialect == "postgres" {
					return sql[:len(sql)-len("? AND consumer_group = ?")] + "$1 AND consumer_group = $2"
				}
				return sql
			}
			for _, r := range rows {
				for col, sql := range map[string]string{
					"pending":    "SELECT COUNT(*) FROM millpond_outbox WHERE status = 'pending' AND stream = ? AND consumer_group = ?",
					"processing": "SELECT COUNT(*) FROM millpond_outbox WHERE status = 'processing' AND stream = ? AND consumer_group = ?",
					"retrying":   "SELECT COUNT(*) FROM millpond_outbox WHERE status = 'pending' AND attempts > 0 AND stream = ? AND consumer_group = ?",
					"dead":       "SELECT COUNT(*) FROM millpond_outbox WHERE status = 'dead_letter' AND stream = ? AND consumer_group = ?",
				} {
					got := map[string]int64{"pending": r.Pending, "processing": r.Processing, "retrying": r.Retrying, "dead": r.Dead}[col]
					if n := f.db.Count(t, q(sql), r.Stream, r.Group); n != got {
						t.Errorf("%s/%s %s: the page shows %d, the database has %d", r.Stream, r.Group, col, got, n)
					}
				}
			}
			if dialect == "sqlite" {
				screenshot(t, ctx, "overview")
			}
			// The grid refreshes itself and the live region follows.
			before := eval[string](t, ctx, `document.getElementById('summary').textContent`)
			f.enqueue(outbox.Event{Stream: "audit", Key: "audit-3", Kind: "Audited", Payload: []byte("x")})
			if _, err := chromedp.Run(ctx, chromedp.Poll[bool](
				`(() => { const c = document.querySelector('#backlog tr[data-stream="audit"] [data-col=pending]'); return c && c.textContent === '2'; })()`,
				chromedp.WithPollingTimeout(10*time.Second))); err != nil {
				t.Fatalf("the grid did not refresh to 2 pending: %v", err)
			}
			after := eval[string](t, ctx, `document.getElementById('summary').textContent`)
			if after == before || eval[string](t, ctx, `document.getElementById('summary').getAttribute('aria-live')`) != "polite" {
				t.Errorf("live summary: %q then %q", before, after)
			}
			if n := dialogs.Load(); n != 0 {
				t.Errorf("%d dialogs opened", n)
			}
		})
	}
}

// TestBrowserRequeueIsDelivered requeues a dead letter through the UI
// (select, confirm) and receives it with a real Subscriber of its group.
func TestBrowserRequeueIsDelivered(t *testing.T) {
	f := newFixture(t, "sqlite")
	srv := f.serve(admin.Options{Prefix: "/admin"})
	ctx, _ := tab(t)
	base := srv.URL + "/admin"
	do(t, ctx, chromedp.Navigate(base+"/dead?stream=orders"), chromedp.WaitVisible(chromedp.CSS("#dead-table")))
	screenshot(t, ctx, "dead-letters")
	do(t, ctx,
		chromedp.Click(chromedp.CSS(fmt.Sprintf("#sel-%d", f.deadShipping))),
		chromedp.Click(chromedp.CSS("#requeue-selected")),
		chromedp.WaitVisible(chromedp.CSS("#confirm-button")),
	)
	what := eval[string](t, ctx, `document.getElementById('confirm-what').textContent`)
	if what != "You are about to requeue 1 selected dead letter." {
		t.Fatalf("confirmation: %q", what)
	}
	if got := f.status(f.deadShipping); got != outbox.StatusDead {
		t.Fatalf("the confirmation page acted: %s", got)
	}
	screenshot(t, ctx, "confirm")
	do(t, ctx, chromedp.Click(chromedp.CSS("#confirm-button")), chromedp.WaitVisible(chromedp.CSS("#result-message")))
	if msg := eval[string](t, ctx, `document.getElementById('result-message').textContent`); msg != "Requeued 1 of 1 dead letters." {
		t.Fatalf("result: %q", msg)
	}
	screenshot(t, ctx, "result")

	// A real subscriber of group shipping now receives order-1 again.
	sub, err := outbox.NewSubscriber(f.store, outbox.SubscriberConfig{ConsumerGroup: "shipping", PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	subCtx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	msgs, err := sub.Subscribe(subCtx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	for delivered := false; !delivered; {
		select {
		case m := <-msgs:
			delivered = m.UUID == "order-1"
			m.Ack()
		case <-subCtx.Done():
			t.Fatal("the requeued event was not delivered")
		}
	}
	for f.status(f.deadShipping) != outbox.StatusDelivered {
		if subCtx.Err() != nil {
			t.Fatalf("the requeued event is %s, not delivered", f.status(f.deadShipping))
		}
		time.Sleep(20 * time.Millisecond)
	}

	// The other pages, for the record.
	do(t, ctx, chromedp.Navigate(fmt.Sprintf("%s/events/%d", base, f.deadDefault)), chromedp.WaitVisible(chromedp.CSS("#payload")))
	screenshot(t, ctx, "event-detail")
	do(t, ctx, chromedp.Navigate(base+"/lookup?stream=orders&key=order-1"), chromedp.WaitVisible(chromedp.CSS("#lookup-results")))
	if n := eval[int](t, ctx, `document.querySelectorAll('#lookup-results tbody tr').length`); n != 2 {
		t.Errorf("lookup by key found %d rows, want 2 (billing and shipping)", n)
	}
	screenshot(t, ctx, "lookup")
	do(t, ctx, chromedp.Navigate(base+"/groups"), chromedp.WaitVisible(chromedp.CSS("#groups-table")))
	screenshot(t, ctx, "groups")
}

// TestBrowserReadOnly: the read-only UI shows no action control, and a POST
// forged from the page itself is refused with 403.
func TestBrowserReadOnly(t *testing.T) {
	f := newFixture(t, "sqlite")
	srv := f.serve(admin.Options{ReadOnly: true})
	ctx, _ := tab(t)
	do(t, ctx, chromedp.Navigate(srv.URL+"/dead"), chromedp.WaitVisible(chromedp.CSS("#dead-table")))
	if n := eval[int](t, ctx, `document.querySelectorAll('form[method=post], button[name=do], input.row-select, #requeue-selected').length`); n != 0 {
		t.Fatalf("the read-only page has %d action controls", n)
	}
	screenshot(t, ctx, "read-only")
	do(t, ctx, chromedp.Navigate(fmt.Sprintf("%s/events/%d", srv.URL, f.deadShipping)), chromedp.WaitVisible(chromedp.CSS("#payload")))
	if n := eval[int](t, ctx, `document.querySelectorAll('form[method=post], button').length`); n != 0 {
		t.Fatalf("the read-only detail page has %d action controls", n)
	}
	status := eval[int](t, ctx, fmt.Sprintf(`fetch('/dead/apply', {method: 'POST', body: new URLSearchParams({do: 'requeue:selected', sel: 'orders|%d'})}).then(r => r.status)`, f.deadShipping))
	if status != http.StatusForbidden {
		t.Fatalf("forged POST from the page: %d, want 403", status)
	}
	if got := f.status(f.deadShipping); got != outbox.StatusDead {
		t.Fatalf("read-only changed the event: %s", got)
	}
}
