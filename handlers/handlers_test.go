package handlers_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millpond/millpond/handlers"
)

type placed struct {
	OrderID int    `json:"order_id"`
	SKU     string `json:"sku"`
}

func newMsg(payload string) *message.Message {
	msg := message.NewMessage("key-1", []byte(payload))
	msg.Metadata.Set("event_kind", "OrderPlaced")
	msg.Metadata.Set("millpond_attempt", "2")
	msg.Metadata.Set("millpond_event_id", "42")
	msg.Metadata.Set("trace", "abc")
	return msg
}

func TestTypedHandlerDecodesAndSeesMeta(t *testing.T) {
	var got placed
	var meta handlers.Meta
	h := handlers.New("reserve", "orders", "OrderPlaced", func(ctx context.Context, ev placed, m handlers.Meta) error {
		got, meta = ev, m
		return nil
	}, handlers.WithMaxAttempts(7), handlers.WithMaxInFlight(3))
	if h.Name() != "reserve" || h.Stream() != "orders" || h.Kind() != "OrderPlaced" {
		t.Fatalf("identity: %s %s %s", h.Name(), h.Stream(), h.Kind())
	}
	if p := h.Policy(); p.MaxAttempts != 7 || p.MaxInFlight != 3 {
		t.Fatalf("policy %+v", p)
	}
	if err := h.Handle(newMsg(`{"order_id":5,"sku":"A-1"}`)); err != nil {
		t.Fatal(err)
	}
	if got != (placed{OrderID: 5, SKU: "A-1"}) {
		t.Errorf("decoded %+v", got)
	}
	if meta.Key != "key-1" || meta.Kind != "OrderPlaced" || meta.Attempt != 2 || meta.EventID != 42 || meta.Metadata.Get("trace") != "abc" {
		t.Errorf("meta %+v", meta)
	}
}

func TestUndecodablePayloadIsPermanent(t *testing.T) {
	called := false
	h := handlers.New("reserve", "orders", "OrderPlaced", func(context.Context, placed, handlers.Meta) error {
		called = true
		return nil
	})
	err := h.Handle(newMsg(`{"order_id":"five"}`))
	if !handlers.IsPermanent(err) || called {
		t.Fatalf("err %v (permanent %v), called %v", err, handlers.IsPermanent(err), called)
	}
	// The text leaves the value out; the decoder's error is still there
	// for errors.As.
	var mismatch *json.UnmarshalTypeError
	if !errors.As(err, &mismatch) || mismatch.Field != "order_id" || strings.Contains(err.Error(), "five") {
		t.Errorf("err %v: want a *json.UnmarshalTypeError of order_id, the value left out", err)
	}
	var syntax *json.SyntaxError
	if err := h.Handle(newMsg(`{"order_id":five}`)); !errors.As(err, &syntax) || strings.Contains(err.Error(), "five") ||
		!strings.HasSuffix(err.Error(), "invalid JSON at byte offset 14") {
		t.Errorf("err %v: want a *json.SyntaxError at byte offset 14, the text left out", err)
	}
}

// panicky panics in its decoder with its input.
type panicky struct{}

func (*panicky) UnmarshalJSON(b []byte) error { panic("cannot take " + string(b)) }

// TestNullAndPanickingPayloadsArePermanent: a JSON null payload would decode
// into the zero event (an order 0) and a decoder's panic escaped the
// handler's recovery (Watermill's router then nacked it without a reason,
// logging the panic value): both are permanent failures whose reason quotes
// nothing of the payload.
func TestNullAndPanickingPayloadsArePermanent(t *testing.T) {
	called := false
	h := handlers.New("reserve", "orders", "OrderPlaced", func(context.Context, placed, handlers.Meta) error {
		called = true
		return nil
	})
	for _, payload := range []string{"null", " null\n"} {
		err := h.Handle(newMsg(payload))
		if !handlers.IsPermanent(err) || called || !strings.HasSuffix(err.Error(), "the payload is JSON null") {
			t.Errorf("payload %q: err %v, called %v; want a permanent failure naming the null payload", payload, err, called)
		}
	}
	p := handlers.New("reserve", "orders", "OrderPlaced", func(context.Context, panicky, handlers.Meta) error { return nil })
	err := p.Handle(newMsg(`"secret-card-4111"`))
	if !handlers.IsPermanent(err) || strings.Contains(err.Error(), "secret-card") {
		t.Errorf("a panicking decoder: %v; want a permanent failure quoting nothing of the payload", err)
	}
}

func TestHandlerErrorsAreRetryableAndPanicsBecomeErrors(t *testing.T) {
	cause := errors.New("database is down")
	h := handlers.New("reserve", "orders", "OrderPlaced", func(context.Context, placed, handlers.Meta) error { return cause })
	err := h.Handle(newMsg(`{}`))
	if !errors.Is(err, cause) || handlers.IsPermanent(err) {
		t.Fatalf("err %v", err)
	}
	p := handlers.New("reserve", "orders", "OrderPlaced", func(context.Context, placed, handlers.Meta) error { panic("boom") })
	err = p.Handle(newMsg(`{}`))
	if err == nil || !strings.Contains(err.Error(), "panic: boom") || handlers.IsPermanent(err) {
		t.Fatalf("panic became %v", err)
	}
}

func TestPermanent(t *testing.T) {
	if handlers.Permanent(nil) != nil {
		t.Error("Permanent(nil) must be nil")
	}
	cause := errors.New("bad")
	err := handlers.Permanent(cause)
	if !errors.Is(err, cause) || !handlers.IsPermanent(err) || handlers.IsPermanent(cause) {
		t.Errorf("Permanent wrapping broken: %v", err)
	}
}

// largeEvent is passed on the stack (too many fields for registers), where
// a traceback reads its fields' values exactly.
type largeEvent struct {
	Card, PIN                 int64
	A, B, C, D, E, F, G, H, I int64
}

//go:noinline
func chargeCard(_ context.Context, ev largeEvent, _ handlers.Meta) error {
	if ev.Card > 0 {
		panic("declined")
	}
	return nil
}

// TestPanicStackHoldsNoArguments: the error a handler's panic becomes
// carries the stack, which a Go traceback prints with the words of each
// frame's arguments, the decoded event's field values among them (a card
// number in hex). The error is stored as the last error and logged by the
// router: the stack keeps its functions, files and lines, not the values.
func TestPanicStackHoldsNoArguments(t *testing.T) {
	const card, pin = 4111111111111111, 4321
	h := handlers.New("charge", "cards", "Charged", chargeCard)
	err := h.Handle(newMsg(fmt.Sprintf(`{"Card": %d, "PIN": %d}`, card, pin)))
	if err == nil || !strings.Contains(err.Error(), "panic: declined") {
		t.Fatalf("panic became %v", err)
	}
	text := err.Error()
	for _, v := range []string{fmt.Sprintf("%#x", card), fmt.Sprintf("%#x", pin), fmt.Sprint(card)} {
		if strings.Contains(text, v) {
			t.Errorf("the panic's error shows an argument's value %s:\n%s", v, text)
		}
	}
	if !strings.Contains(text, "handlers_test.chargeCard(...)") || !strings.Contains(text, "handlers_test.go:") {
		t.Errorf("the stack lost the handler's frame:\n%s", text)
	}
}
