// Package handout lets the bus have an outbox Subscriber prepare each
// message of a handler in the subscription's own goroutine, just before it
// hands the message out to Watermill's router.
//
// The router runs every message in a goroutine of its own, which starts
// with a small stack: a handler that decodes the payload there (encoding/json
// runs deep) first has its stack grown and copied, once per message. The
// subscription's dispatch goroutines live as long as the subscription, so
// their stacks are grown once: decoding there costs the decoding alone.
package handout

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Preparer is implemented by handlers that prepare a message before the
// router hands it to them (the typed handlers of handlers.New decode its
// payload). PrepareHandOut runs in the subscription's goroutine, must not
// panic, and may only add to the message's context: the handler must handle
// the message as well without it (a message the router gets from elsewhere,
// a payload a middleware replaced).
type Preparer interface {
	PrepareHandOut(msg *message.Message)
}

type key struct{}

// WithPreparers returns ctx carrying, for each subscriber, the function
// that prepares its messages. The bus runs its router with it; the router
// passes it on to each subscriber's Subscribe.
func WithPreparers(ctx context.Context, preparers map[any]func(*message.Message)) context.Context {
	if len(preparers) == 0 {
		return ctx
	}
	return context.WithValue(ctx, key{}, preparers)
}

// For returns the function that prepares the messages of subscriber s, or
// nil when ctx (a Subscribe context) names none.
func For(ctx context.Context, s any) func(*message.Message) {
	m, _ := ctx.Value(key{}).(map[any]func(*message.Message))
	return m[s]
}
