// Package safetext makes stored text safe to show to an operator in a
// terminal or a web page. Failure texts and payloads come from handlers and
// producers: a bidirectional override (U+202E), a zero-width character or a
// line separator in them would make what an operator reads differ from
// what is stored (reordering the rest of a line or a table row, hiding
// characters, breaking a row in two). Such characters are shown as \u
// escapes instead. Format, for the Format methods of types that hold
// secrets, writes their redacted description whatever the verb.
package safetext

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Line returns s with every control character (newlines and tabs
// included), format character (bidirectional controls, zero-width
// characters) and line or paragraph separator written as a \uXXXX escape,
// for one line of a table or a page, and every byte that is not UTF-8 as
// \xNN. Other text is unchanged.
func Line(s string) string { return escape(s, false) }

// Block is Line for text of several lines, such as a pretty-printed
// payload: newlines and tabs stay as they are.
func Block(s string) string { return escape(s, true) }

func unsafe(r rune, block bool) bool {
	if block && (r == '\n' || r == '\t') {
		return false
	}
	return unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp)
}

func escape(s string, block bool) string {
	if utf8.ValidString(s) && strings.IndexFunc(s, func(r rune) bool { return unsafe(r, block) }) < 0 {
		return s
	}
	var b strings.Builder
	for i, r := range s {
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(s[i:], "\uFFFD"):
			// A byte that is not UTF-8 (such as 0x9B, a control sequence
			// to a terminal reading Latin-1).
			fmt.Fprintf(&b, `\x%02X`, s[i])
		case unsafe(r, block):
			fmt.Fprintf(&b, `\u%04X`, r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Format writes s, a redacted description, for a Format method of a type
// that holds secrets: %d, %x or %s of a struct would otherwise print its
// fields one by one, past String and GoString. Every verb writes s as %s
// does, with the directive's width, precision and flags; %q quotes it.
func Format(f fmt.State, verb rune, s string) {
	if verb != 'q' {
		verb = 's'
	}
	_, _ = fmt.Fprintf(f, fmt.FormatString(f, verb), s)
}
