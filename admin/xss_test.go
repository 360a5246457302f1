package admin_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/millpond/millpond/admin"
	"github.com/millpond/millpond/outbox"
)

// TestBrowserRendersHostileDataInert stores HTML and script in every field
// that can hold them (payload, metadata, last error; keys and kinds refuse
// them) and in the query parameters the pages echo, and checks in the
// browser that no script ran, no element was injected and the text appears
// literally.
func TestBrowserRendersHostileDataInert(t *testing.T) {
	f := newFixture(t, "sqlite")
	const (
		payload = `<script>alert("payload")</script><img src=x onerror=alert("img")>`
		jsonPay = `{"note":"</code></pre><script>alert(\"json\")</script>","html":"<b onmouseover=alert(1)>x</b>"}`
		meta    = `"><script>alert("meta")</script>`
		reason  = `<script>alert("error")</script><svg onload=alert("svg")>`
	)
	// Keys and kinds are identifiers: HTML cannot even be stored in them.
	for _, ev := range []outbox.Event{
		{Stream: "xss", Key: `<script>alert(1)</script>`, Kind: "K", Payload: []byte("x")},
		{Stream: "xss", Key: "k", Kind: `<img src=x onerror=alert(1)>`, Payload: []byte("x")},
		{Stream: `<b>`, Key: "k", Kind: "K", Payload: []byte("x")},
	} {
		tx, _, rollback := f.db.Begin(t)
		_, err := f.store.Enqueue(context.Background(), tx, ev)
		rollback()
		if !errors.Is(err, outbox.ErrInvalidKey) {
			t.Fatalf("enqueue with HTML in an identifier: %v, want ErrInvalidKey", err)
		}
	}
	rawID := f.enqueue(outbox.Event{Stream: "xss", Key: "raw", Kind: "Hostile", Payload: []byte(payload),
		Metadata: map[string]string{"note": meta, `<i>key</i>`: "v"}})
	jsonID := f.enqueue(outbox.Event{Stream: "xss", Key: "json", Kind: "Hostile", Payload: []byte(jsonPay)})
	claimed := f.claim("xss", "", 2)
	for _, c := range claimed {
		f.fail(c, reason, 1)
	}
	srv := f.serve(admin.Options{Prefix: "/admin"})
	base := srv.URL + "/admin"
	ctx, dialogs := tab(t)

	// The raw payload is shown as text, literally.
	do(t, ctx, chromedp.Navigate(fmt.Sprintf("%s/events/%d", base, rawID)), chromedp.WaitVisible(chromedp.CSS("#payload")))
	if got := eval[string](t, ctx, `document.querySelector('#payload code').textContent`); got != payload {
		t.Errorf("payload text: %q", got)
	}
	if got := eval[string](t, ctx, `document.querySelector('#metadata tbody tr:nth-child(2) td').textContent`); got != meta {
		t.Errorf("metadata text: %q", got)
	}
	if got := eval[string](t, ctx, `document.querySelector('#metadata tbody tr:nth-child(1) th').textContent`); got != `<i>key</i>` {
		t.Errorf("metadata key text: %q", got)
	}
	if got := eval[string](t, ctx, `document.getElementById('event-error').textContent`); got != reason {
		t.Errorf("last error text: %q", got)
	}
	checkInert(t, ctx, "detail (raw)")
	screenshot(t, ctx, "hostile-event")

	// The JSON payload is pretty-printed, still as text.
	do(t, ctx, chromedp.Navigate(fmt.Sprintf("%s/events/%d", base, jsonID)), chromedp.WaitVisible(chromedp.CSS("#payload")))
	want := "{\n  \"note\": \"</code></pre><script>alert(\\\"json\\\")</script>\",\n  \"html\": \"<b onmouseover=alert(1)>x</b>\"\n}"
	if got := eval[string](t, ctx, `document.querySelector('#payload code').textContent`); got != want {
		t.Errorf("JSON payload text:\n%s\nwant\n%s", got, want)
	}
	checkInert(t, ctx, "detail (JSON)")

	// The dead-letter list shows the error text literally.
	do(t, ctx, chromedp.Navigate(base+"/dead?stream=xss"), chromedp.WaitVisible(chromedp.CSS("#dead-table")))
	if got := eval[string](t, ctx, `document.querySelector('#dead-table tbody td.error-text').textContent`); got != reason {
		t.Errorf("dead list error text: %q", got)
	}
	checkInert(t, ctx, "dead list")

	// Query parameters echoed into forms and error messages.
	hostile := `"><script>alert("q")</script><img src=x onerror=alert("q")>`
	for _, u := range []string{
		base + "/dead?q=" + url.QueryEscape(hostile),
		base + "/dead?kind=" + url.QueryEscape(hostile),
		base + "/dead?stream=" + url.QueryEscape(hostile) + "&group=" + url.QueryEscape(hostile),
		base + "/lookup?stream=" + url.QueryEscape(hostile) + "&key=" + url.QueryEscape(hostile),
		base + "/lookup?id=" + url.QueryEscape(hostile),
		base + "/events/" + url.PathEscape(hostile),
	} {
		do(t, ctx, chromedp.Navigate(u), chromedp.WaitVisible(chromedp.CSS("h1")))
		checkInert(t, ctx, u)
	}
	do(t, ctx, chromedp.Navigate(base+"/dead?q="+url.QueryEscape(hostile)), chromedp.WaitVisible(chromedp.CSS("#f-q")))
	if got := eval[string](t, ctx, `document.getElementById('f-q').value`); got != hostile {
		t.Errorf("filter field value: %q", got)
	}
	do(t, ctx, chromedp.Navigate(base+"/lookup?stream="+url.QueryEscape(hostile)+"&key=k"), chromedp.WaitVisible(chromedp.CSS("#l-stream")))
	if got := eval[string](t, ctx, `document.getElementById('l-stream').value`); got != hostile {
		t.Errorf("lookup field value: %q", got)
	}

	// Give any injected handler a moment, then count the dialogs.
	time.Sleep(200 * time.Millisecond)
	if n := dialogs.Load(); n != 0 {
		t.Fatalf("%d JavaScript dialogs opened: injected script ran", n)
	}
	if n := eval[int](t, ctx, `window.__xss || 0`); n != 0 {
		t.Fatal("injected script ran")
	}
}

// checkInert fails when the page holds elements that only injected markup
// would create: scripts other than the page's own, img, svg, b or i.
func checkInert(t *testing.T, ctx context.Context, where string) {
	t.Helper()
	n := eval[int](t, ctx, `document.querySelectorAll('script:not([src$="/static/admin.js"]), main img, main svg, main b, main i, [onerror], [onload], [onmouseover]').length`)
	if n != 0 {
		t.Errorf("%s: %d injected elements", where, n)
	}
	if s := eval[int](t, ctx, `document.querySelectorAll('script').length`); s != 1 {
		t.Errorf("%s: %d script elements, want the page's own one", where, s)
	}
}
