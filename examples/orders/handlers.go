package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/millpond/millpond/handlers"
)

// workers holds what the handlers share.
type workers struct {
	domain *Domain
	delay  time.Duration // ORDERS_HANDLER_DELAY, for tests
	log    *zap.Logger
}

func newWorkers(d *Domain, cfg config, log *zap.Logger) *workers {
	return &workers{domain: d, delay: cfg.HandlerDelay, log: log.Named("handlers")}
}

// pause sleeps for the configured handler delay, if any.
func (w *workers) pause(ctx context.Context) error {
	if w.delay <= 0 {
		return nil
	}
	t := time.NewTimer(w.delay)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("handler delay: %w", ctx.Err())
	}
}

// newReserveStock returns the reserve-stock handler: it reserves stock for
// a placed order, or rejects the order.
func newReserveStock(w *workers) handlers.Handler {
	return handlers.New[OrderPlaced]("reserve-stock", Stream, KindOrderPlaced,
		func(ctx context.Context, ev OrderPlaced, meta handlers.Meta) error {
			if err := w.pause(ctx); err != nil {
				return err
			}
			decided, err := w.domain.Reserve(ctx, ev.OrderID)
			if errors.Is(err, ErrOrderNotFound) {
				// The event commits with its order, so this is corruption
				// that no retry fixes.
				return handlers.Permanent(err)
			}
			if err != nil {
				return err
			}
			if decided == "" {
				w.log.Info("order already decided; redelivery ignored", zap.String("order_id", ev.OrderID), zap.Int("attempt", meta.Attempt))
			}
			return nil
		})
}

// newNotify returns the notify handler: it notifies the customer of a
// placed order.
func newNotify(w *workers) handlers.Handler {
	return handlers.New[OrderPlaced]("notify", Stream, KindOrderPlaced,
		func(ctx context.Context, ev OrderPlaced, meta handlers.Meta) error {
			if err := w.pause(ctx); err != nil {
				return err
			}
			inserted, err := w.domain.Notify(ctx, ev)
			if err != nil {
				return err
			}
			if !inserted {
				w.log.Info("customer already notified; redelivery ignored", zap.String("order_id", ev.OrderID), zap.Int("attempt", meta.Attempt))
			}
			return nil
		})
}

// newReadModelPlaced returns the read-model handler of OrderPlaced.
func newReadModelPlaced(w *workers) handlers.Handler {
	return handlers.New[OrderPlaced]("read-model.placed", Stream, KindOrderPlaced,
		func(ctx context.Context, ev OrderPlaced, _ handlers.Meta) error {
			if err := w.pause(ctx); err != nil {
				return err
			}
			return w.domain.UpdateView(ctx, ev.OrderID, viewChange{status: StatusPlaced})
		})
}

// newReadModelReserved returns the read-model handler of OrderReserved.
func newReadModelReserved(w *workers) handlers.Handler {
	return handlers.New[OrderReserved]("read-model.reserved", Stream, KindOrderReserved,
		func(ctx context.Context, ev OrderReserved, _ handlers.Meta) error {
			if err := w.pause(ctx); err != nil {
				return err
			}
			return w.domain.UpdateView(ctx, ev.OrderID, viewChange{status: StatusReserved, reserved: true})
		})
}

// newReadModelRejected returns the read-model handler of OrderRejected.
func newReadModelRejected(w *workers) handlers.Handler {
	return handlers.New[OrderRejected]("read-model.rejected", Stream, KindOrderRejected,
		func(ctx context.Context, ev OrderRejected, _ handlers.Meta) error {
			if err := w.pause(ctx); err != nil {
				return err
			}
			return w.domain.UpdateView(ctx, ev.OrderID, viewChange{status: StatusRejected})
		})
}

// newReadModelNotified returns the read-model handler of CustomerNotified.
func newReadModelNotified(w *workers) handlers.Handler {
	return handlers.New[CustomerNotified]("read-model.notified", Stream, KindCustomerNotified,
		func(ctx context.Context, ev CustomerNotified, _ handlers.Meta) error {
			if err := w.pause(ctx); err != nil {
				return err
			}
			return w.domain.UpdateView(ctx, ev.OrderID, viewChange{status: StatusPlaced, notified: true})
		})
}
