package admin

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/millpond/millpond/internal/safetext"
)

//go:embed web/templates/*.html
var templateFS embed.FS

//go:embed web/static
var staticFS embed.FS

// staticHandler serves the embedded script and style sheet.
func staticHandler() http.Handler {
	sub, err := fs.Sub(staticFS, "web/static")
	if err != nil {
		panic(err) // the embedded directory exists at compile time
	}
	return http.FileServerFS(sub)
}

// pageNames are the templates, each parsed with the layout.
var pageNames = []string{"overview", "dead", "confirm", "result", "event", "lookup", "groups", "groupconfirm", "error"}

type templates struct{ byName map[string]*template.Template }

var funcs = template.FuncMap{
	"group":     groupLabel,
	"age":       formatAge,
	"ts":        formatTime,
	"join":      strings.Join,
	"hasString": func(list []string, s string) bool { return slices.Contains(list, s) },
	// line shows stored text (a failure text) on one line, with
	// bidirectional controls, zero-width characters and line breaks
	// escaped (see internal/safetext).
	"line": safetext.Line,
	// deadLink is the dead-letter list's query for one stream and group.
	"deadLink": func(stream, group string) template.URL {
		return deadFilter{Stream: stream, Group: groupParam(group)}.query()
	},
}

func parseTemplates() (*templates, error) {
	t := &templates{byName: map[string]*template.Template{}}
	for _, name := range pageNames {
		tpl, err := template.New(name).Funcs(funcs).ParseFS(templateFS, "web/templates/layout.html", "web/templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("admin: parse template %s: %w", name, err)
		}
		t.byName[name] = tpl
	}
	return t, nil
}

// page is what every template receives.
type page struct {
	// Title is the page's title and first heading.
	Title string
	// Nav names the current navigation entry.
	Nav string
	// P is the path prefix for links.
	P string
	// ReadOnly hides actions.
	ReadOnly bool
	// CSRF is the token for action forms ("" when read-only).
	CSRF string
	// Data is the page's own data.
	Data any
}

// render executes a page (or, with block set, one named template of it)
// into a buffer first, so a failure answers 500 instead of half a page.
func (s *server) render(w http.ResponseWriter, r *http.Request, status int, name, block string, p page) {
	p.P, p.ReadOnly = s.prefix, s.readOnly
	if !s.readOnly {
		p.CSRF = s.csrf.token(w, r)
	}
	tpl := s.pages.byName[name]
	if block == "" {
		block = "layout"
	}
	var buf bytes.Buffer
	if err := tpl.ExecuteTemplate(&buf, block, p); err != nil {
		s.log.Error("admin: render page", "page", name, "error", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// fail answers with an error page.
func (s *server) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	s.render(w, r, status, "error", "", page{Title: http.StatusText(status), Data: msg})
}

// storeFailed logs a Store error (its text names no event data) and
// answers 500 without it.
func (s *server) storeFailed(w http.ResponseWriter, r *http.Request, what string, err error) {
	s.log.Error("admin: "+what, "error", err)
	s.fail(w, r, http.StatusInternalServerError, "The database could not be read or changed ("+what+"). The server's log has the details.")
}

// groupLabel shows the default group, stored as "", readably.
func groupLabel(g string) string {
	if g == "" {
		return "(default)"
	}
	return g
}

// formatAge shows a duration for people: 3.2s, 4m05s, 2h10m, 3d4h.
func formatAge(d time.Duration) string {
	switch {
	case d <= 0:
		return "–"
	case d < time.Minute:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
}

// formatTime shows a time in UTC, or a dash for the zero time.
func formatTime(t time.Time) string {
	if t.IsZero() {
		return "–"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000 UTC")
}

// payloadView is a payload as the detail page shows it.
type payloadView struct {
	// Text is the payload as text: indented JSON, UTF-8 text or a hex dump.
	Text string
	// Form says which: "JSON", "text" or "binary (hex)".
	Form string
	// Bytes is the payload's length.
	Bytes int
}

func viewPayload(b []byte) payloadView {
	v := payloadView{Bytes: len(b)}
	var out bytes.Buffer
	switch {
	case len(b) == 0:
		v.Form = "empty"
	case json.Valid(b) && indentedSize(b) > 2*len(b)+64<<10:
		// Deeply nested: indenting would write most of the page as spaces
		// (1 MiB nested 40 deep makes 35 MB).
		v.Text, v.Form = safetext.Block(string(b)), "JSON (as stored: too deeply nested to indent)"
	case json.Valid(b) && json.Indent(&out, b, "", "  ") == nil:
		v.Text, v.Form = safetext.Block(out.String()), "JSON"
	case utf8.Valid(b):
		v.Text, v.Form = safetext.Block(string(b)), "text"
	default:
		var hex strings.Builder
		for i := 0; i < len(b); i += 16 {
			end := min(i+16, len(b))
			fmt.Fprintf(&hex, "%08x  % x\n", i, b[i:end])
		}
		v.Text, v.Form = hex.String(), "binary (hex)"
	}
	return v
}

// indentedSize is at least the length of json.Indent(b, "", "  ") for valid
// JSON b: each bracket and comma may start a line indented two spaces a
// level, each colon gains a space.
func indentedSize(b []byte) int {
	n, depth, inString, escaped := len(b), 0, false, false
	for _, c := range b {
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '{' || c == '[':
			depth++
			n += 1 + 2*depth
		case c == '}' || c == ']':
			depth--
			n += 1 + 2*depth
		case c == ',':
			n += 1 + 2*depth
		case c == ':':
			n++
		}
	}
	return n
}
