package safetext

import "testing"

func TestEscapes(t *testing.T) {
	for _, c := range []struct{ in, line, block string }{
		{"plain text, é and 日本", "plain text, é and 日本", "plain text, é and 日本"},
		{"amount \u202E001$", `amount \u202E001$`, `amount \u202E001$`},
		{"a\u2028b\u2029c", `a\u2028b\u2029c`, `a\u2028b\u2029c`},
		{"zero\u200Bwidth\uFEFF", `zero\u200Bwidth\uFEFF`, `zero\u200Bwidth\uFEFF`},
		{"two\nlines\tand\x1b[31mred", `two\u000Alines\u0009and\u001B[31mred`, "two\nlines\tand\\u001B[31mred"},
		{"isolate \u2066x\u2069", `isolate \u2066x\u2069`, `isolate \u2066x\u2069`},
		{"latin-1 \x9b[31m", `latin-1 \x9B[31m`, `latin-1 \x9B[31m`},
		{"kept \uFFFD, cut \xe2\x80", "kept \uFFFD, cut \\xE2\\x80", "kept \uFFFD, cut \\xE2\\x80"},
	} {
		if got := Line(c.in); got != c.line {
			t.Errorf("Line(%q) = %q, want %q", c.in, got, c.line)
		}
		if got := Block(c.in); got != c.block {
			t.Errorf("Block(%q) = %q, want %q", c.in, got, c.block)
		}
	}
}
