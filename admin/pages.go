package admin

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/millpond/millpond/outbox"
)

// overviewRow is one stream and group of the overview grid.
type overviewRow struct {
	Stream, Group                       string
	Pending, Processing, Retrying, Dead int64
	OldestPendingAge                    time.Duration
	// Blocked counts events waiting behind an earlier event of their
	// ordering key; HeldKeys the keys a dead letter holds.
	Blocked, HeldKeys int64
	DeadLink          template.URL
}

type overviewData struct {
	Rows []overviewRow
	// Total sums the rows (its OldestPendingAge is the largest).
	Total overviewRow
	// RefreshMS is the refresh interval in milliseconds, 0 for none.
	RefreshMS int64
	// RefreshLabel is the interval for people.
	RefreshLabel string
	// Summary is the one-line total the live region announces.
	Summary string
	// Updated is when the data was read.
	Updated time.Time
}

func (s *server) overviewData(r *http.Request) (overviewData, error) {
	stats, err := s.store.Stats(r.Context())
	if err != nil {
		return overviewData{}, err
	}
	d := overviewData{Updated: time.Now().UTC()}
	if s.refresh > 0 {
		d.RefreshMS, d.RefreshLabel = s.refresh.Milliseconds(), s.refresh.String()
	}
	for _, st := range stats {
		row := overviewRow{
			Stream: st.Stream, Group: st.Group, Pending: st.Pending, Processing: st.Processing,
			Retrying: st.Retrying, Dead: st.Dead, OldestPendingAge: st.OldestPendingAge,
			Blocked: st.Blocked, HeldKeys: st.HeldKeys,
			DeadLink: deadFilter{Stream: st.Stream, Group: groupParam(st.Group)}.query(),
		}
		d.Rows = append(d.Rows, row)
		t := &d.Total
		t.Pending += row.Pending
		t.Processing += row.Processing
		t.Retrying += row.Retrying
		t.Dead += row.Dead
		t.Blocked += row.Blocked
		t.HeldKeys += row.HeldKeys
		t.OldestPendingAge = max(t.OldestPendingAge, row.OldestPendingAge)
	}
	t := d.Total
	d.Summary = fmt.Sprintf("%d pending (%d retrying), %d in flight, %d dead letters in %d stream and group pairs.",
		t.Pending, t.Retrying, t.Processing, t.Dead, len(d.Rows))
	return d, nil
}

func (s *server) overview(w http.ResponseWriter, r *http.Request) {
	d, err := s.overviewData(r)
	if err != nil {
		s.storeFailed(w, r, "read the backlog", err)
		return
	}
	block := ""
	if r.URL.Query().Get("fragment") == "grid" {
		block = "grid"
	}
	s.render(w, r, http.StatusOK, "overview", block, page{Title: "Overview", Nav: "overview", Data: d})
}

// defaultGroupParam selects the default group "" in a filter (a group name
// cannot contain parentheses).
const defaultGroupParam = "(default)"

func groupParam(g string) string {
	if g == "" {
		return defaultGroupParam
	}
	return g
}

// deadFilter selects dead letters: every field is optional.
type deadFilter struct {
	// Stream limits to one stream.
	Stream string
	// Group limits to one group: "" is every group, defaultGroupParam the
	// default group.
	Group string
	// Kind limits to one event kind.
	Kind string
	// Text keeps dead letters whose last error contains it, ignoring case.
	Text string
}

func filterFrom(v url.Values) (deadFilter, error) {
	f := deadFilter{
		Stream: strings.TrimSpace(v.Get("stream")), Group: strings.TrimSpace(v.Get("group")),
		Kind: strings.TrimSpace(v.Get("kind")), Text: strings.TrimSpace(v.Get("q")),
	}
	if f.Stream != "" {
		if err := outbox.ValidateKey("stream", f.Stream); err != nil {
			return f, err
		}
	}
	if f.Group != "" && f.Group != defaultGroupParam {
		if err := outbox.ValidateKey("consumer group", f.Group); err != nil {
			return f, err
		}
	}
	if f.Kind != "" {
		if err := outbox.ValidateKey("event kind", f.Kind); err != nil {
			return f, err
		}
	}
	if len(f.Text) > outbox.MaxErrorBytes {
		return f, fmt.Errorf("the error text to search for is longer than %d bytes", outbox.MaxErrorBytes)
	}
	return f, nil
}

// query is the filter as URL query parameters, already encoded.
func (f deadFilter) query() template.URL {
	v := url.Values{}
	for k, val := range map[string]string{"stream": f.Stream, "group": f.Group, "kind": f.Kind, "q": f.Text} {
		if val != "" {
			v.Set(k, val)
		}
	}
	return template.URL(v.Encode()) // url.Values.Encode escapes every value
}

func (f deadFilter) matches(d outbox.DeadEvent) bool {
	return (f.Kind == "" || d.Kind == f.Kind) &&
		(f.Text == "" || strings.Contains(strings.ToLower(d.LastError), strings.ToLower(f.Text)))
}

// describe says in words what the filter selects.
func (f deadFilter) describe() string {
	var parts []string
	if f.Stream != "" {
		parts = append(parts, "stream "+f.Stream)
	} else {
		parts = append(parts, "every stream")
	}
	switch f.Group {
	case "":
		parts = append(parts, "every group")
	case defaultGroupParam:
		parts = append(parts, "the default group")
	default:
		parts = append(parts, "group "+f.Group)
	}
	if f.Kind != "" {
		parts = append(parts, "kind "+f.Kind)
	}
	if f.Text != "" {
		parts = append(parts, fmt.Sprintf("last error containing %q", f.Text))
	}
	return strings.Join(parts, ", ")
}

// Scan bounds: a page shows deadPageSize matches; one request reads at most
// maxScan dead letters.
const (
	deadPageSize = 50
	maxScan      = 100_000
)

// scanResult is what scanDead found.
type scanResult struct {
	Matches []outbox.DeadEvent
	// NextStream and NextAfter continue the scan where it stopped (Next
	// is false when it reached the end).
	Next       bool
	NextStream string
	NextAfter  int64
	// Truncated is true when the scan stopped at maxScan rows.
	Truncated bool
}

// scanDead reads dead letters matching f, stream by stream in name order and
// by id within a stream, from (fromStream, afterID), stopping after want
// matches (0: no limit) and the next match (then Next is true: another page
// follows), or after maxScan rows read. With maxID > 0 only ids up to
// it are considered.
func (s *server) scanDead(r *http.Request, f deadFilter, fromStream string, afterID int64, want int, maxID int64) (scanResult, error) {
	var streams []string
	if f.Stream != "" {
		streams = []string{f.Stream}
	} else {
		stats, err := s.store.Stats(r.Context())
		if err != nil {
			return scanResult{}, err
		}
		seen := map[string]bool{}
		for _, st := range stats {
			if st.Dead > 0 {
				seen[st.Stream] = true
			}
		}
		streams = slices.Sorted(maps.Keys(seen))
	}
	var res scanResult
	scanned := 0
	// full: the page has its want matches; the scan goes on to the next
	// match, so that a page is followed by a next one only when there is
	// one (not by an empty page when the matches end with it).
	full := false
	for _, stream := range streams {
		if fromStream != "" && stream < fromStream {
			continue
		}
		after := int64(0)
		if stream == fromStream {
			after = afterID
		}
		q := outbox.DeadQuery{Stream: stream, AfterID: after, Limit: outbox.MaxBatch, AllGroups: f.Group == ""}
		if f.Group == defaultGroupParam {
			q.Group = ""
		} else if f.Group != "" {
			q.Group = f.Group
		}
	pages:
		for {
			dead, err := s.store.ListDead(r.Context(), q)
			if err != nil {
				return res, err
			}
			for _, d := range dead {
				if maxID > 0 && d.ID > maxID {
					break pages
				}
				scanned++
				if f.matches(d) {
					if full {
						res.Next = true // another match follows the page
						return res, nil
					}
					res.Matches = append(res.Matches, d)
					if want > 0 && len(res.Matches) == want {
						full = true
						res.NextStream, res.NextAfter = stream, d.ID
					}
				}
				if scanned >= maxScan {
					if !full {
						res.Truncated = true
						res.NextStream, res.NextAfter = stream, d.ID
					}
					res.Next = true
					return res, nil
				}
			}
			if len(dead) < q.Limit {
				break
			}
			q.AfterID = dead[len(dead)-1].ID
		}
	}
	res.NextStream, res.NextAfter = "", 0 // the matches ended with this page
	return res, nil
}

type deadData struct {
	Filter      deadFilter
	FilterQuery template.URL
	Streams     []string
	Groups      []string
	Kinds       []string
	Scan        scanResult
	NextLink    template.URL
	First       bool
	Error       string
}

func (s *server) deadList(w http.ResponseWriter, r *http.Request) {
	v := r.URL.Query()
	f, ferr := filterFrom(v)
	d := deadData{Filter: f, FilterQuery: f.query()}
	stats, err := s.store.Stats(r.Context())
	if err != nil {
		s.storeFailed(w, r, "read the backlog", err)
		return
	}
	streams, groups := map[string]bool{}, map[string]bool{}
	for _, st := range stats {
		streams[st.Stream] = true
		if st.Group != "" {
			groups[st.Group] = true
		}
	}
	d.Streams, d.Groups = slices.Sorted(maps.Keys(streams)), slices.Sorted(maps.Keys(groups))
	status := http.StatusOK
	if ferr != nil {
		d.Error, status = ferr.Error(), http.StatusBadRequest
		s.render(w, r, status, "dead", "", page{Title: "Dead letters", Nav: "dead", Data: d})
		return
	}
	fromStream := v.Get("after_stream")
	afterID, _ := strconv.ParseInt(v.Get("after_id"), 10, 64)
	d.First = fromStream == "" && afterID <= 0
	d.Scan, err = s.scanDead(r, f, fromStream, max(afterID, 0), deadPageSize, 0)
	if err != nil {
		if errors.Is(err, outbox.ErrInvalidKey) {
			d.Error = err.Error()
			s.render(w, r, http.StatusBadRequest, "dead", "", page{Title: "Dead letters", Nav: "dead", Data: d})
			return
		}
		s.storeFailed(w, r, "list dead letters", err)
		return
	}
	kinds := map[string]bool{}
	for _, m := range d.Scan.Matches {
		kinds[m.Kind] = true
	}
	d.Kinds = slices.Sorted(maps.Keys(kinds))
	if d.Scan.Next {
		next := url.Values{}
		for k, vals := range v {
			next[k] = vals
		}
		next.Set("after_stream", d.Scan.NextStream)
		next.Set("after_id", strconv.FormatInt(d.Scan.NextAfter, 10))
		d.NextLink = template.URL(next.Encode())
	}
	s.render(w, r, status, "dead", "", page{Title: "Dead letters", Nav: "dead", Data: d})
}

// deadAction is one thing that can be done to dead letters.
type deadAction struct {
	Name, Verb, Done string
	// Explain is shown on the confirmation page.
	Explain string
}

var deadActions = map[string]deadAction{
	"requeue": {Name: "requeue", Verb: "Requeue", Done: "requeued",
		Explain: "Requeued dead letters become pending again with their attempts reset; their group's consumers receive them again."},
	"reroute": {Name: "reroute", Verb: "Reroute", Done: "rerouted",
		Explain: "Rerouting moves dead letters of a stream's default group (events no group took when they were enqueued) to the groups that take their kind now, as fresh pending deliveries. Dead letters of named groups, and those of kinds no group takes yet, stay where they are."},
	"discard": {Name: "discard", Verb: "Discard", Done: "discarded",
		Explain: "Discarded dead letters are deleted for good."},
}

// target is a set of dead letters an action applies to.
type target struct {
	Action deadAction
	// Scope is "selected" (Refs) or "matching" (Filter, ids up to MaxID).
	Scope  string
	Refs   []ref
	Filter deadFilter
	MaxID  int64
	// Confirmed is the digest of the refs the confirmation page showed
	// ("matching" scope): the action applies only to exactly those.
	Confirmed string
	// Truncated is true when the filter matched more than one request reads.
	Truncated bool
}

// digest identifies a set of refs (in the order resolve lists them).
func digest(refs []ref) string {
	h := sha256.New()
	for _, rf := range refs {
		h.Write([]byte(rf.Value()))
		h.Write([]byte{'\n'})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// ref names one dead letter: its stream and id.
type ref struct {
	Stream string
	ID     int64
}

// Value encodes the ref for a form ("stream|id": a stream never contains |).
func (r ref) Value() string { return r.Stream + "|" + strconv.FormatInt(r.ID, 10) }

func parseRef(s string) (ref, error) {
	stream, id, ok := strings.Cut(s, "|")
	n, err := strconv.ParseInt(id, 10, 64)
	if !ok || err != nil || n <= 0 {
		return ref{}, fmt.Errorf("%q does not name a dead letter", s)
	}
	if err := outbox.ValidateKey("stream", stream); err != nil {
		return ref{}, err
	}
	return ref{Stream: stream, ID: n}, nil
}

// readTarget reads an action's form: the action, and either the selected
// refs or the filter (with everything matching it up to max_id).
func (s *server) readTarget(r *http.Request) (target, int, string) {
	name, scope := r.PostForm.Get("action"), r.PostForm.Get("scope")
	if do := r.PostForm.Get("do"); do != "" { // a button names both: "requeue:selected"
		name, scope, _ = strings.Cut(do, ":")
	}
	act, ok := deadActions[name]
	if !ok {
		return target{}, http.StatusBadRequest, "Unknown action."
	}
	t := target{Action: act, Scope: scope}
	switch t.Scope {
	case "selected":
		seen := map[ref]bool{}
		for _, v := range r.PostForm["sel"] {
			rf, err := parseRef(v)
			if err != nil {
				return t, http.StatusBadRequest, err.Error()
			}
			if !seen[rf] {
				seen[rf] = true
				t.Refs = append(t.Refs, rf)
			}
		}
		if len(t.Refs) == 0 {
			return t, http.StatusBadRequest, "No dead letter was selected. Select some, or choose the action for everything matching the filter."
		}
	case "matching":
		f, err := filterFrom(r.PostForm)
		if err != nil {
			return t, http.StatusBadRequest, err.Error()
		}
		t.Filter = f
		if v := r.PostForm.Get("max_id"); v != "" {
			if t.MaxID, err = strconv.ParseInt(v, 10, 64); err != nil || t.MaxID <= 0 {
				return t, http.StatusBadRequest, "Invalid max_id."
			}
		}
		t.Confirmed = r.PostForm.Get("confirmed")
	default:
		return t, http.StatusBadRequest, "Unknown scope."
	}
	return t, 0, ""
}

// resolve lists the refs of a "matching" target now.
func (s *server) resolve(r *http.Request, t *target) error {
	if t.Scope != "matching" {
		return nil
	}
	res, err := s.scanDead(r, t.Filter, "", 0, 0, t.MaxID)
	if err != nil {
		return err
	}
	t.Truncated = res.Truncated
	t.Refs = t.Refs[:0]
	for _, d := range res.Matches {
		t.Refs = append(t.Refs, ref{Stream: d.Stream, ID: d.ID})
		t.MaxID = max(t.MaxID, d.ID)
	}
	return nil
}

type confirmData struct {
	Target      target
	Filter      string
	Preview     []ref
	More        int
	Back        template.URL
	Form        []hidden
	EventLink   bool
	Description string
}

// hidden is a hidden form field.
type hidden struct{ Name, Value string }

func (s *server) deadConfirm(w http.ResponseWriter, r *http.Request) {
	t, status, msg := s.readTarget(r)
	if status != 0 {
		s.fail(w, r, status, msg)
		return
	}
	t.MaxID = 0 // the confirmation takes the snapshot
	if err := s.resolve(r, &t); err != nil {
		s.storeFailed(w, r, "list dead letters", err)
		return
	}
	d := confirmData{Target: t, Back: template.URL(r.PostForm.Get("back"))}
	if !strings.HasPrefix(string(d.Back), "dead?") && !strings.HasPrefix(string(d.Back), "events/") {
		d.Back = "dead"
	}
	form := []hidden{{"action", t.Action.Name}, {"scope", t.Scope}}
	if t.Scope == "matching" {
		d.Filter = t.Filter.describe()
		form = append(form, hidden{"stream", t.Filter.Stream}, hidden{"group", t.Filter.Group},
			hidden{"kind", t.Filter.Kind}, hidden{"q", t.Filter.Text}, hidden{"max_id", strconv.FormatInt(t.MaxID, 10)},
			hidden{"confirmed", digest(t.Refs)})
	} else {
		for _, rf := range t.Refs {
			form = append(form, hidden{"sel", rf.Value()})
		}
	}
	d.Form = form
	d.Preview = t.Refs[:min(len(t.Refs), 20)]
	d.More = len(t.Refs) - len(d.Preview)
	s.render(w, r, http.StatusOK, "confirm", "", page{Title: "Confirm: " + strings.ToLower(t.Action.Verb), Nav: "dead", Data: d})
}

type resultData struct {
	Message string
	Details []string
}

func (s *server) deadApply(w http.ResponseWriter, r *http.Request) {
	t, status, msg := s.readTarget(r)
	if status != 0 {
		s.fail(w, r, status, msg)
		return
	}
	if t.Scope == "matching" && (t.MaxID <= 0 || t.Confirmed == "") {
		s.fail(w, r, http.StatusBadRequest, "Confirm the action first.")
		return
	}
	if err := s.resolve(r, &t); err != nil {
		s.storeFailed(w, r, "list dead letters", err)
		return
	}
	if t.Scope == "matching" && digest(t.Refs) != t.Confirmed {
		// A dead letter below the confirmed id died since (ids are given
		// at enqueue, not at death), or one confirmed is gone: acting now
		// would touch rows the operator did not see.
		s.log.Info("admin: action refused", "reason", "the matching dead letters changed since the confirmation", "status", http.StatusConflict)
		s.fail(w, r, http.StatusConflict, fmt.Sprintf("The dead letters matching the filter changed since you confirmed (%d match now). Nothing was changed: go back, review them and confirm again.", len(t.Refs)))
		return
	}
	byStream := map[string][]int64{}
	for _, rf := range t.Refs {
		byStream[rf.Stream] = append(byStream[rf.Stream], rf.ID)
	}
	var changed int64
	for _, stream := range slices.Sorted(maps.Keys(byStream)) {
		ids := byStream[stream]
		for start := 0; start < len(ids); start += outbox.MaxBatch {
			chunk := ids[start:min(start+outbox.MaxBatch, len(ids))]
			var n int64
			var err error
			switch t.Action.Name {
			case "requeue":
				var k int
				k, err = s.store.Requeue(r.Context(), stream, chunk...)
				n = int64(k)
			case "reroute":
				var k int
				k, err = s.store.Reroute(r.Context(), stream, chunk...)
				n = int64(k)
			case "discard":
				n, err = s.store.DiscardDead(r.Context(), outbox.DeadSelector{Stream: stream, IDs: chunk})
			}
			changed += n
			if err != nil {
				s.log.Error("admin: dead letter action failed", "action", t.Action.Name, "done_before_error", changed, "error", err)
				s.fail(w, r, http.StatusInternalServerError, fmt.Sprintf("The %s failed after %d of %d dead letters were %s. The server's log has the details.",
					t.Action.Name, changed, len(t.Refs), t.Action.Done))
				return
			}
		}
	}
	s.log.Info("admin: dead letters "+t.Action.Done, "selected", len(t.Refs), "changed", changed)
	d := resultData{}
	d.Message = fmt.Sprintf("%s %d of %d dead letters.", capitalize(t.Action.Done), changed, len(t.Refs))
	if int(changed) < len(t.Refs) {
		switch t.Action.Name {
		case "reroute":
			d.Details = append(d.Details, "The others are not in a stream's default group, or no group takes their kind yet, or they were no longer dead letters.")
		default:
			d.Details = append(d.Details, "The others were no longer dead letters (another operator or process got there first).")
		}
	}
	if t.Truncated {
		d.Details = append(d.Details, fmt.Sprintf("The filter matched more dead letters than one request reads (%d); run the action again for the rest.", maxScan))
	}
	s.render(w, r, http.StatusOK, "result", "", page{Title: "Done", Nav: "dead", Data: d})
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

type metaPair struct{ Key, Value string }

type eventData struct {
	Record   outbox.EventRecord
	Payload  payloadView
	Metadata []metaPair
	Siblings []outbox.EventRecord
	// Reroutable is true for a dead letter of the default group.
	Reroutable bool
	Ref        ref
}

func (s *server) eventDetail(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		s.fail(w, r, http.StatusNotFound, "An event id is a positive integer.")
		return
	}
	rows, err := s.store.FindEvents(r.Context(), outbox.EventQuery{ID: id})
	if err != nil {
		s.storeFailed(w, r, "look the event up", err)
		return
	}
	if len(rows) == 0 {
		s.fail(w, r, http.StatusNotFound, fmt.Sprintf("There is no event with id %d (it may have been delivered and purged, or acknowledged by a store that deletes on acknowledgement).", id))
		return
	}
	rec := rows[0]
	d := eventData{Record: rec, Payload: viewPayload(rec.Payload),
		Reroutable: rec.Status == outbox.StatusDead && rec.Group == "", Ref: ref{Stream: rec.Stream, ID: rec.ID}}
	for _, k := range slices.Sorted(maps.Keys(rec.Metadata)) {
		d.Metadata = append(d.Metadata, metaPair{k, rec.Metadata[k]})
	}
	all, err := s.store.FindEvents(r.Context(), outbox.EventQuery{Stream: rec.Stream, Key: rec.Key})
	if err != nil {
		s.storeFailed(w, r, "look the event up", err)
		return
	}
	for _, o := range all {
		if o.ID != rec.ID {
			d.Siblings = append(d.Siblings, o)
		}
	}
	s.render(w, r, http.StatusOK, "event", "", page{Title: fmt.Sprintf("Event %d", rec.ID), Nav: "lookup", Data: d})
}

type lookupData struct {
	ID, Stream, Key string
	Streams         []string
	Searched        bool
	Results         []outbox.EventRecord
	Error           string
}

func (s *server) lookup(w http.ResponseWriter, r *http.Request) {
	v := r.URL.Query()
	d := lookupData{ID: strings.TrimSpace(v.Get("id")), Stream: strings.TrimSpace(v.Get("stream")), Key: strings.TrimSpace(v.Get("key"))}
	stats, err := s.store.Stats(r.Context())
	if err != nil {
		s.storeFailed(w, r, "read the backlog", err)
		return
	}
	streams := map[string]bool{}
	for _, st := range stats {
		streams[st.Stream] = true
	}
	d.Streams = slices.Sorted(maps.Keys(streams))
	status := http.StatusOK
	var q outbox.EventQuery
	switch {
	case d.ID != "":
		id, err := strconv.ParseInt(d.ID, 10, 64)
		if err != nil || id <= 0 {
			d.Error = "An event id is a positive integer."
			break
		}
		q.ID = id
	case d.Key != "" || d.Stream != "":
		q.Stream, q.Key = d.Stream, d.Key
	}
	if d.Error == "" && q != (outbox.EventQuery{}) {
		d.Searched = true
		d.Results, err = s.store.FindEvents(r.Context(), q)
		switch {
		case errors.Is(err, outbox.ErrInvalidKey) || errors.Is(err, outbox.ErrInvalidID):
			d.Error = strings.TrimPrefix(err.Error(), "outbox: find events: ")
		case err != nil:
			s.storeFailed(w, r, "look the event up", err)
			return
		}
	}
	if d.Error != "" {
		status = http.StatusBadRequest
	}
	s.render(w, r, status, "lookup", "", page{Title: "Look up an event", Nav: "lookup", Data: d})
}

type groupsData struct {
	Groups []outbox.GroupInfo
}

func (s *server) groups(w http.ResponseWriter, r *http.Request) {
	var d groupsData
	var err error
	if d.Groups, err = s.store.ListGroups(r.Context()); err != nil {
		s.storeFailed(w, r, "list groups", err)
		return
	}
	slices.SortFunc(d.Groups, func(a, b outbox.GroupInfo) int {
		return cmp.Or(strings.Compare(a.Stream, b.Stream), strings.Compare(a.Group, b.Group))
	})
	s.render(w, r, http.StatusOK, "groups", "", page{Title: "Consumer groups", Nav: "groups", Data: d})
}

type groupConfirmData struct {
	Stream, Group string
	Discard       bool
	// Pending, Processing and Dead count the group's undelivered events
	// when the confirmation was shown: what a discard deletes.
	Pending, Processing, Dead int64
}

// Undelivered is what a discard would delete, as of the confirmation.
func (d groupConfirmData) Undelivered() int64 { return d.Pending + d.Processing + d.Dead }

// readGroup reads the stream and group of an unregister form.
func (s *server) readGroup(r *http.Request) (groupConfirmData, int, string) {
	d := groupConfirmData{Stream: r.PostForm.Get("stream"), Group: r.PostForm.Get("group"), Discard: r.PostForm.Get("discard") == "1"}
	if err := outbox.ValidateKey("stream", d.Stream); err != nil {
		return d, http.StatusBadRequest, err.Error()
	}
	if err := outbox.ValidateKey("consumer group", d.Group); err != nil {
		return d, http.StatusBadRequest, err.Error()
	}
	return d, 0, ""
}

func (s *server) groupConfirm(w http.ResponseWriter, r *http.Request) {
	d, status, msg := s.readGroup(r)
	if status != 0 {
		s.fail(w, r, status, msg)
		return
	}
	// Say what "also discard" would delete, and how many.
	groups, err := s.store.ListGroups(r.Context(), d.Stream)
	if err != nil {
		s.storeFailed(w, r, "list groups", err)
		return
	}
	for _, g := range groups {
		if g.Group == d.Group {
			d.Pending, d.Processing, d.Dead = g.Pending, g.Processing, g.Dead
		}
	}
	s.render(w, r, http.StatusOK, "groupconfirm", "", page{Title: "Confirm: unregister a group", Nav: "groups", Data: d})
}

func (s *server) groupApply(w http.ResponseWriter, r *http.Request) {
	d, status, msg := s.readGroup(r)
	if status != 0 {
		s.fail(w, r, status, msg)
		return
	}
	res, err := s.store.RetireGroup(r.Context(), outbox.RetireRequest{Stream: d.Stream, Group: d.Group, Discard: d.Discard})
	if err != nil && res.Pending+res.Processing > 0 && !d.Discard {
		s.log.Info("admin: unregister group refused: not drained")
		s.fail(w, r, http.StatusConflict, fmt.Sprintf("The group was not unregistered: it has %d pending and %d processing events. Let its consumers drain them, or unregister it with its events discarded.",
			res.Pending, res.Processing))
		return
	}
	if errors.Is(err, outbox.ErrGroupNotRegistered) {
		// Unregistered already (a second submit, another operator).
		s.log.Info("admin: unregister group refused: not registered")
		s.fail(w, r, http.StatusConflict, "The group "+d.Group+" of stream "+d.Stream+" is not registered (unregistered already?) and has no events to discard: nothing was changed.")
		return
	}
	if err != nil {
		s.storeFailed(w, r, "unregister the group", err)
		return
	}
	s.log.Info("admin: group unregistered", "discarded", d.Discard, "was_registered", res.Unregistered)
	out := resultData{Message: "Unregistered the group " + d.Group + " of stream " + d.Stream + "."}
	if !res.Unregistered {
		out.Message = "The group " + d.Group + " of stream " + d.Stream + " was not registered; its events were discarded."
	}
	if d.Discard {
		out.Details = append(out.Details, fmt.Sprintf("Discarded %d pending, %d processing and %d dead-lettered events.", res.Pending, res.Processing, res.Dead))
	}
	s.render(w, r, http.StatusOK, "result", "", page{Title: "Done", Nav: "groups", Data: out})
}
