package outbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"
)

// RecordHandlerError is a Watermill handler middleware that keeps a failed
// handler's error text on the message, so the Subscriber stores it (sanitised
// and cut to MaxErrorBytes) as the event's last error when the router Nacks.
func RecordHandlerError(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if err != nil {
			msg.Metadata.Set(MetadataHandlerError, err.Error())
		}
		return out, err
	}
}

type receiptKey struct{}

// delivery is what a Subscriber puts in the context of a message it hands
// out: the claim's receipt and the Store it came from.
type delivery struct {
	receipt Receipt
	store   *Store
	held    bool // from a held claim (SubscriberConfig.HoldClaims): no receipt
}

// ReceiptFromContext returns the receipt of the delivery a Subscriber put
// in a message's context. It is kept out of the metadata so that the claim
// key never reaches logs or republished messages.
func ReceiptFromContext(ctx context.Context) (Receipt, bool) {
	d, ok := ctx.Value(receiptKey{}).(delivery)
	return d.receipt, ok && !d.held
}

// AcknowledgeMessageInTx is Store.AcknowledgeMessageInTx for code that has
// the message but not the Store (a typed handler: see handlers.Meta): it
// acknowledges msg inside tx through the Store whose Subscriber delivered
// it. A message no outbox Subscriber delivered is refused with
// ErrNoReceipt.
func AcknowledgeMessageInTx(ctx context.Context, tx Tx, msg *message.Message) error {
	d, ok := msg.Context().Value(receiptKey{}).(delivery)
	if !ok || d.store == nil {
		return fmt.Errorf("outbox: acknowledge %s in a transaction: %w", messageRef(msg), ErrNoReceipt)
	}
	return d.store.AcknowledgeMessageInTx(ctx, tx, msg)
}

// messageRef names a message in an error without its UUID, which for an
// outbox message is the event key: by the event id a Subscriber set, or
// not at all.
func messageRef(msg *message.Message) string {
	if id := msg.Metadata.Get(MetadataEventID); id != "" {
		if _, err := strconv.ParseInt(id, 10, 64); err == nil {
			return "the message of event " + id
		}
	}
	return "a message"
}

// metadataAckedInTx marks a message acknowledged by AcknowledgeMessageInTx.
const metadataAckedInTx = "millpond_acked_in_tx"

// AcknowledgeMessageInTx acknowledges a message delivered by a Subscriber
// inside the caller's open transaction, together with the handler's own
// writes: the event is delivered exactly when those writes commit, and
// retried if they roll back. Ack the message afterwards as usual; the
// Subscriber then writes no acknowledgement of its own.
//
// Acknowledge last, just before committing, and commit before acking the
// message: the acknowledgement locks the event's row until tx ends. The
// Subscriber stops extending the lease of an event acknowledged this way,
// but an extension already under way waits for that lock.
func (s *Store) AcknowledgeMessageInTx(ctx context.Context, tx Tx, msg *message.Message) error {
	if err := s.ready(ctx); err != nil {
		return err
	}
	r, ok := ReceiptFromContext(msg.Context())
	if !ok {
		if d, _ := msg.Context().Value(receiptKey{}).(delivery); d.held {
			return fmt.Errorf("outbox: acknowledge %s in a transaction: a subscriber holding its claims (HoldClaims) acknowledges only through Ack: %w", messageRef(msg), ErrNoReceipt)
		}
		return fmt.Errorf("outbox: acknowledge %s in a transaction: %w", messageRef(msg), ErrNoReceipt)
	}
	if err := s.AcknowledgeInTx(ctx, tx, r); err != nil {
		return err
	}
	msg.Metadata.Set(metadataAckedInTx, "true")
	return nil
}

// ErrNoReceipt reports a message that carries no claim to acknowledge: it
// was not delivered by an outbox Subscriber, or by one that holds its
// claims (SubscriberConfig.HoldClaims), whose events are acknowledged only
// by their Ack.
var ErrNoReceipt = errors.New("outbox: the message was not delivered by an outbox Subscriber")
