package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.uber.org/zap"

	"github.com/millpond/millpond/handlers"
	"github.com/millpond/millpond/outbox"
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

// ack returns the acknowledgement of the delivery described by meta,
// inside the handler's transaction.
func ack(meta handlers.Meta) ackFunc {
	return func(ctx context.Context, tx *sql.Tx) error { return meta.AcknowledgeInTx(ctx, outbox.SQLTx(tx)) }
}

// permanentIf marks the errors that no retry fixes (an order that does not
// exist although its event commits with it, an event out of order) as
// permanent: the event is dead-lettered at once, holding its order's later
// events (the default dead-letter policy) until an operator requeues it.
func permanentIf(err error) error {
	if errors.Is(err, ErrOrderNotFound) || errors.Is(err, ErrOutOfOrder) {
		return handlers.Permanent(err)
	}
	return err
}

// newStockGroup returns the reserve-stock group: one consumer group taking
// OrderPlaced and OrderCancelled, so that an order's cancellation is
// handled after its placement even when it was committed before the
// placement was handled. OrderPlaced reserves the stock or rejects the
// order; OrderCancelled gives the reservation back. Each commits with its
// acknowledgement.
func newStockGroup(w *workers) group {
	return group{name: "reserve-stock", kinds: map[string]kindFunc{
		KindOrderPlaced: on(func(ctx context.Context, ev OrderPlaced, meta handlers.Meta) error {
			if err := w.pause(ctx); err != nil {
				return err
			}
			decided, err := w.domain.Reserve(ctx, ev.OrderID, ack(meta))
			if err != nil {
				return permanentIf(err)
			}
			if decided == "" {
				w.log.Warn("order already decided; redelivery ignored", zap.String("order_id", ev.OrderID), zap.Int("attempt", meta.Attempt))
			}
			return nil
		}),
		KindOrderCancelled: on(func(ctx context.Context, ev OrderCancelled, meta handlers.Meta) error {
			if err := w.pause(ctx); err != nil {
				return err
			}
			_, released, err := w.domain.Release(ctx, ev.OrderID, ack(meta))
			if err != nil {
				return permanentIf(err)
			}
			if !released {
				w.log.Warn("cancellation already handled; redelivery ignored", zap.String("order_id", ev.OrderID), zap.Int("attempt", meta.Attempt))
			}
			return nil
		}),
	}}
}

// newReadModelGroup returns the read-model group: one consumer group taking
// every kind the read model shows (ViewKinds), so that it applies an
// order's events in the order they happened, each a plain update
// committed with its acknowledgement.
func newReadModelGroup(w *workers) group {
	kinds := map[string]kindFunc{}
	for _, kind := range ViewKinds {
		kinds[kind] = func(msg *message.Message, meta handlers.Meta) error {
			var ev struct {
				OrderID string `json:"order_id"`
			}
			if err := json.Unmarshal(msg.Payload, &ev); err != nil || ev.OrderID == "" {
				return handlers.Permanent(fmt.Errorf("decode %s payload: no order id (%v)", kind, err))
			}
			if err := w.pause(msg.Context()); err != nil {
				return err
			}
			return permanentIf(w.domain.UpdateView(msg.Context(), kind, ev.OrderID, ack(meta)))
		}
	}
	return group{name: "read-model", kinds: kinds}
}

// newNotify returns the notify handler: it notifies the customer of a
// placed order. It is a bus handler of one kind (its group takes nothing
// else, so order does not concern it) and idempotent: the notification's
// unique order id makes a second delivery a no-op.
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
