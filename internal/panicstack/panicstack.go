// Package panicstack gives the stack of a recovered panic without the
// values of the frames' arguments. A Go traceback prints the words of each
// frame's arguments ("main.charge({0xe9b08a568f1c7, 0x10e1, ...})"): for a
// handler, the fields of the decoded event among them, which must not
// reach a stored failure text or a log line.
package panicstack

import (
	"regexp"
	"runtime/debug"
	"strings"
)

// Stack is debug.Stack with every frame's arguments written as "(...)".
func Stack() string { return Strip(string(debug.Stack())) }

// Strip replaces the argument list of every function line of a traceback
// with "(...)" (an empty one stays "()"); file lines, goroutine headers and
// "created by" lines are left. Arguments hold no parenthesis, so a frame's
// list starts at its line's last '('.
func Strip(stack string) string {
	lines := strings.Split(stack, "\n")
	for i, l := range lines {
		if l == "" || l[0] == '\t' || !strings.HasSuffix(l, ")") {
			continue
		}
		if j := strings.LastIndexByte(l, '('); j > 0 && l[j:] != "()" {
			lines[i] = l[:j] + "(...)"
		}
	}
	return strings.Join(lines, "\n")
}

// header is a traceback's goroutine line ("goroutine 7 [running]:").
var header = regexp.MustCompile(`goroutine [0-9]+ \[[^\]\n]*\]:`)

// StripTraceback strips (as Strip does) the traceback that text holds,
// from its first goroutine line on, and leaves the text before it as it
// is: an error or log line that quotes a stack, such as Watermill's
// recovered-panic error ("panic occurred: ..., stacktrace: goroutine 7
// [running]: ..."). Text without a goroutine line comes back unchanged.
func StripTraceback(text string) string {
	loc := header.FindStringIndex(text)
	if loc == nil {
		return text
	}
	return text[:loc[0]] + Strip(text[loc[0]:])
}
