package handlers_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/millpond/millpond/handlers"
)

// OrderPlaced is the example's event, carried as JSON.
type OrderPlaced struct {
	OrderID string `json:"order_id"`
	SKU     string `json:"sku"`
	Qty     int    `json:"qty"`
}

var errUnknownSKU = errors.New("unknown sku")

// reserve stands in for the application's own, idempotent, work.
func reserve(ctx context.Context, orderID, sku string, qty int) error {
	if sku == "" {
		return errUnknownSKU
	}
	return nil
}

// A typed handler: its name is its consumer group, and it takes the
// OrderPlaced events of stream "orders". Returning nil acknowledges the
// event, an error retries it after the policy's backoff (dead-lettered at
// the attempt limit), and an error wrapped by Permanent dead-letters it at
// once. Give the handler to bus.New, or to fxmodule.AsHandler; the bus
// package's example runs one.
func ExampleNew() {
	h := handlers.New("reserve-stock", "orders", "OrderPlaced",
		func(ctx context.Context, ev OrderPlaced, meta handlers.Meta) error {
			err := reserve(ctx, ev.OrderID, ev.SKU, ev.Qty) // delivery is at least once
			if errors.Is(err, errUnknownSKU) {
				return handlers.Permanent(err) // no retry can fix it
			}
			return err
		},
		handlers.WithMaxAttempts(5),
		handlers.WithBackoff(func(attempt int) time.Duration { return time.Duration(attempt) * time.Second }),
	)
	fmt.Println(h.Name(), h.Stream(), h.Kind(), h.Policy().MaxAttempts)
	// Output: reserve-stock orders OrderPlaced 5
}
