package panicstack

import "testing"

func TestStrip(t *testing.T) {
	in := "goroutine 8 [running]:\nruntime/debug.Stack()\n\t/go/src/runtime/debug/stack.go:26 +0x5e\n" +
		"github.com/x/handlers.(*typed[...]).Handle.func1()\n\t/x/handlers.go:324 +0x4c\n" +
		"panic({0x754e00?, 0x8088a0?})\n\t/go/src/runtime/panic.go:860 +0x13a\n" +
		"main.charge({0x108?, 0x7896e0?}, {0xe9b08a568f1c7, 0x10e1, 0x0, ...}, ...)\n\t/x/main.go:141 +0x34\n" +
		"github.com/x/handlers.(*typed[...]).Handle(0x810f20, 0x1ca0b525c660)\n\t/x/handlers.go:327 +0x1f3\n" +
		"main.inlined(...)\n\t/x/main.go:12\n" +
		"created by testing.(*T).Run in goroutine 1\n\t/go/src/testing/testing.go:2101 +0x4c5\n"
	want := "goroutine 8 [running]:\nruntime/debug.Stack()\n\t/go/src/runtime/debug/stack.go:26 +0x5e\n" +
		"github.com/x/handlers.(*typed[...]).Handle.func1()\n\t/x/handlers.go:324 +0x4c\n" +
		"panic(...)\n\t/go/src/runtime/panic.go:860 +0x13a\n" +
		"main.charge(...)\n\t/x/main.go:141 +0x34\n" +
		"github.com/x/handlers.(*typed[...]).Handle(...)\n\t/x/handlers.go:327 +0x1f3\n" +
		"main.inlined(...)\n\t/x/main.go:12\n" +
		"created by testing.(*T).Run in goroutine 1\n\t/go/src/testing/testing.go:2101 +0x4c5\n"
	if got := Strip(in); got != want {
		t.Errorf("Strip:\n%s\nwant:\n%s", got, want)
	}
}

// StripTraceback leaves the text before a quoted traceback (its lines may
// end in parentheses too) and text without one as they are.
func TestStripTraceback(t *testing.T) {
	plain := "charge failed (card declined)\nretry later (in 5s)"
	if got := StripTraceback(plain); got != plain {
		t.Errorf("text without a traceback changed: %q", got)
	}
	in := "panic occurred: \"declined (4111)\", stacktrace: \ngoroutine 12 [running]:\n" +
		"main.charge({0xe9b08a568f1c7, 0x10e1})\n\t/x/main.go:141 +0x34\n"
	want := "panic occurred: \"declined (4111)\", stacktrace: \ngoroutine 12 [running]:\n" +
		"main.charge(...)\n\t/x/main.go:141 +0x34\n"
	if got := StripTraceback(in); got != want {
		t.Errorf("StripTraceback:\n%s\nwant:\n%s", got, want)
	}
	inline := "Panic recovered in handler. Stack: goroutine 7 [running]:\nmain.f(0x2a)\n"
	if got, want := StripTraceback(inline), "Panic recovered in handler. Stack: goroutine 7 [running]:\nmain.f(...)\n"; got != want {
		t.Errorf("StripTraceback(%q) = %q, want %q", inline, got, want)
	}
}
