package gostack

import (
	"testing"
	"unsafe"
)

// useStack needs a frame of 6 KiB: more than a new goroutine's first stack
// holds, less than Grow makes room for.
//
//go:noinline
func useStack(i int) byte {
	var frame [6 << 10]byte
	frame[i] = 1
	return frame[len(frame)-1-i]
}

// stackMoved reports whether the calling goroutine's stack was copied (grown)
// while useStack ran: a local variable's address then changes.
//
//go:noinline
func stackMoved() bool {
	var x byte
	before := uintptr(unsafe.Pointer(&x))
	useStack(0)
	return uintptr(unsafe.Pointer(&x)) != before
}

// inNewGoroutine runs f in a goroutine of its own, as Watermill's router
// runs a message's handling.
func inNewGoroutine(f func() bool) bool {
	done := make(chan bool)
	go func() { done <- f() }()
	return <-done
}

// After Grow, a goroutine uses Bytes of stack without growing it again.
func TestGrowMakesRoomInOneStep(t *testing.T) {
	if !inNewGoroutine(stackMoved) {
		t.Skip("a new goroutine's first stack already holds 6 KiB (the runtime's adaptive start): nothing to tell apart")
	}
	if inNewGoroutine(func() bool { Grow(); return stackMoved() }) {
		t.Fatal("the stack grew after Grow: Grow did not make room for 6 KiB")
	}
}
