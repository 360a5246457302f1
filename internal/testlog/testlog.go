// Package testlog holds logging helpers for millpond's tests.
package testlog

import (
	"maps"
	"slices"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
)

// Capture is a Watermill capture logger that can be read while the
// router still logs: a closed router's goroutines log after Close returns
// (Run's last line, each handler's "Subscriber stopped", the watcher of
// stopped handlers), and watermill.CaptureLoggerAdapter.Captured returns its
// live map without a copy, so reading it then races with those writes.
type Capture struct {
	mu    *sync.Mutex
	inner watermill.LoggerAdapter
	all   *watermill.CaptureLoggerAdapter
}

// NewCapture returns an empty Capture.
func NewCapture() Capture {
	all := watermill.NewCaptureLogger()
	return Capture{mu: &sync.Mutex{}, inner: all, all: all}
}

// Captured copies what was logged so far, by level.
func (c Capture) Captured() map[watermill.LogLevel][]watermill.CapturedMessage {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := maps.Clone(c.all.Captured())
	for level, lines := range out {
		out[level] = slices.Clone(lines)
	}
	return out
}

func (c Capture) Error(msg string, err error, fields watermill.LogFields) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.inner.Error(msg, err, fields)
}

func (c Capture) Info(msg string, fields watermill.LogFields) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.inner.Info(msg, fields)
}

func (c Capture) Debug(msg string, fields watermill.LogFields) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.inner.Debug(msg, fields)
}

func (c Capture) Trace(msg string, fields watermill.LogFields) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.inner.Trace(msg, fields)
}

func (c Capture) With(fields watermill.LogFields) watermill.LoggerAdapter {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Capture{mu: c.mu, inner: c.inner.With(fields), all: c.all}
}
