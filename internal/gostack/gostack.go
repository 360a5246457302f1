// Package gostack grows a goroutine's stack ahead of work that needs more
// than a new goroutine's first stack.
//
// Watermill's router handles every message in a goroutine of its own, whose
// first stack is small (2 KiB unless the runtime's adaptive start chose
// more). A typed handler's JSON decoding alone outgrows it twice, and each
// growth allocates a stack twice the size, copies the old one and adjusts
// every frame on it: the deeper the growth happens, the more frames there
// are to adjust. Growing once, while the stack is still shallow, is the
// cheapest way to get the room.
package gostack

// Bytes is the stack Grow makes room for: enough for the JSON decoder and a
// handler of ordinary depth.
const Bytes = 8 << 10

// Grow grows the calling goroutine's stack, in one step, so that Bytes more
// fit below the caller's frame. On a stack already that large it only
// clears its frame.
func Grow() { grow(0) }

// grow's frame is Bytes large: entering it makes the runtime grow the stack
// to hold it. i is always 0; it keeps the compiler from removing the frame.
//
//go:noinline
func grow(i int) byte {
	var frame [Bytes]byte
	frame[i] = 1
	return frame[Bytes-1-i]
}
