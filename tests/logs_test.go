package tests

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
)

// logLines records, as text lines, what a Subscriber (through a Watermill
// LoggerAdapter) and a Store (through slog) log, for tests that assert on
// log output.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

// add records one line: level, message, error and the fields in key order.
func (l *logLines) add(level, msg string, err error, fields watermill.LogFields) {
	var b strings.Builder
	b.WriteString(level + " " + msg)
	if err != nil {
		b.WriteString(" error=" + err.Error())
	}
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%v", k, fields[k])
	}
	l.mu.Lock()
	l.lines = append(l.lines, b.String())
	l.mu.Unlock()
}

// matching returns the recorded lines that contain any of the words, case
// insensitively.
func (l *logLines) matching(words ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range l.lines {
		lower := strings.ToLower(line)
		for _, w := range words {
			if strings.Contains(lower, strings.ToLower(w)) {
				out = append(out, line)
				break
			}
		}
	}
	return out
}

// watermill returns a LoggerAdapter that records into l, Debug and Trace
// included.
func (l *logLines) watermill() watermill.LoggerAdapter { return wmRecorder{rec: l} }

// slog returns a slog.Logger that records into l, every level included.
func (l *logLines) slog() *slog.Logger { return slog.New(slogRecorder{rec: l}) }

type wmRecorder struct {
	rec    *logLines
	fields watermill.LogFields
}

func (w wmRecorder) Error(msg string, err error, fields watermill.LogFields) {
	w.rec.add("ERROR", msg, err, w.fields.Add(fields))
}
func (w wmRecorder) Info(msg string, fields watermill.LogFields) {
	w.rec.add("INFO", msg, nil, w.fields.Add(fields))
}
func (w wmRecorder) Debug(msg string, fields watermill.LogFields) {
	w.rec.add("DEBUG", msg, nil, w.fields.Add(fields))
}
func (w wmRecorder) Trace(msg string, fields watermill.LogFields) {
	w.rec.add("TRACE", msg, nil, w.fields.Add(fields))
}
func (w wmRecorder) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return wmRecorder{rec: w.rec, fields: w.fields.Add(fields)}
}

type slogRecorder struct {
	rec   *logLines
	attrs []slog.Attr
}

func (s slogRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (s slogRecorder) Handle(_ context.Context, r slog.Record) error {
	fields := watermill.LogFields{}
	for _, a := range s.attrs {
		fields[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool {
		fields[a.Key] = a.Value.String()
		return true
	})
	s.rec.add(r.Level.String(), r.Message, nil, fields)
	return nil
}

func (s slogRecorder) WithAttrs(attrs []slog.Attr) slog.Handler {
	return slogRecorder{rec: s.rec, attrs: append(slices.Clip(s.attrs), attrs...)}
}

func (s slogRecorder) WithGroup(string) slog.Handler { return s }
