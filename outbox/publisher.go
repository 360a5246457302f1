package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Metadata keys the Publisher reads and the Subscriber sets.
const (
	// MetadataKind carries the event kind. On publish it is read first,
	// then MetadataCQRSName, then the topic is used; on delivery both keys
	// hold the kind.
	MetadataKind = "event_kind"
	// MetadataCQRSName is where Watermill's CQRS marshalers keep the event
	// name, so cqrs.EventProcessor runs unchanged on the Subscriber.
	MetadataCQRSName = "name"
	// MetadataEventKey, when set on publish, is the idempotency key instead
	// of the message UUID.
	MetadataEventKey = "event_key"
	// MetadataAttempt is set on delivery to the attempt number (1 first).
	MetadataAttempt = "millpond_attempt"
	// MetadataEventID is set on delivery to the row id.
	MetadataEventID = "millpond_event_id"
	// MetadataHandlerError is where a handler (or the RecordHandlerError
	// middleware) leaves the error text that a Nack stores as last error.
	MetadataHandlerError = "millpond_handler_error"
	// MetadataDeadLetterNow, set to any value by a handler before a Nack,
	// dead-letters the event at once instead of retrying it (for failures
	// that no retry can fix, such as a payload that does not decode).
	MetadataDeadLetterNow = "millpond_dead_letter_now"
	// MetadataDeadLetterSkip, set to any value by a handler with
	// MetadataDeadLetterNow before a Nack, dead-letters an event with an
	// ordering key without holding the later events of its key, whatever
	// the group's DeadLetterPolicy: for an event the group will never
	// handle (the bus sets it on an event of a kind its handler no longer
	// takes), which a requeue could not get past.
	MetadataDeadLetterSkip = "millpond_dead_letter_skip"
	// MetadataOrderingKey, when set on publish, is the event's ordering
	// key (see Event.OrderingKey); on delivery it holds the ordering key,
	// and is absent for unordered events.
	MetadataOrderingKey = "millpond_ordering_key"
	// MetadataOrderingSeq is set on delivery of an event with an ordering
	// key to its position in the key's sequence (see Claimed.OrderingSeq).
	MetadataOrderingSeq = "millpond_ordering_seq"
)

// topicField names a Watermill topic in the errors of a topic the outbox
// refuses: Watermill takes any string, the outbox a stream's characters.
const topicField = "topic (the outbox stream)"

type txKey struct{}

// ContextWithTx returns a context carrying the caller's open transaction
// (SQLTx or PgxTx), for a Publisher made by NewContextPublisher. Set it on
// each message with msg.SetContext.
func ContextWithTx(ctx context.Context, tx Tx) context.Context {
	return context.WithValue(ctx, txKey{}, tx)
}

// TxFromContext returns the transaction ContextWithTx stored.
func TxFromContext(ctx context.Context) (Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(Tx)
	return tx, ok
}

// Publisher is a Watermill message.Publisher that enqueues each message as
// an outbox event inside a transaction: the topic is the stream, the message
// UUID (or MetadataEventKey) the idempotency key, MetadataKind (or
// MetadataCQRSName, or else the topic) the event kind, MetadataOrderingKey
// the ordering key (none: unordered), and the metadata is stored and
// restored on delivery.
type Publisher struct {
	store *Store
	mode  publishMode
	tx    Tx

	mu     sync.RWMutex
	closed bool
}

type publishMode int

const (
	publishInTx publishMode = iota
	publishFromContext
	publishAutoCommit
)

// NewPublisher returns a Publisher bound to the caller's open transaction,
// the way watermill-sql's publisher is built over a tx: construct one per
// transaction; the events commit or roll back with it.
func NewPublisher(store *Store, tx Tx) (*Publisher, error) {
	if store == nil {
		return nil, errors.New("outbox: new publisher: nil store")
	}
	if _, err := tx.executor(); err != nil {
		return nil, fmt.Errorf("outbox: new publisher: %w", err)
	}
	return &Publisher{store: store, mode: publishInTx, tx: tx}, nil
}

// NewContextPublisher returns a long-lived Publisher that takes the
// transaction from each message's context (see ContextWithTx) and refuses a
// message without one with ErrNoTransaction.
func NewContextPublisher(store *Store) (*Publisher, error) {
	if store == nil {
		return nil, errors.New("outbox: new publisher: nil store")
	}
	return &Publisher{store: store, mode: publishFromContext}, nil
}

// NewAutoCommitPublisher returns a Publisher that opens, and commits, its
// own transaction for each Publish call (all messages of one call together).
// Use it only for events that go with no write of the caller's; to make
// data and events atomic use NewPublisher or NewContextPublisher.
func NewAutoCommitPublisher(store *Store) (*Publisher, error) {
	if store == nil {
		return nil, errors.New("outbox: new publisher: nil store")
	}
	return &Publisher{store: store, mode: publishAutoCommit}, nil
}

// Publish enqueues the messages to the topic's stream. Publishing the same
// UUID with the same kind and payload again is a no-op; with other content it
// fails with ErrIdempotencyConflict.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return ErrClosed
	}
	// The topic is the stream: refused here under its Watermill name, not
	// as a "stream" by the enqueue.
	if err := ValidateKey(topicField, topic); err != nil {
		return fmt.Errorf("outbox: publish: %w", err)
	}
	if len(msgs) > 0 {
		// A NewDeferred store opens here if nothing opened it before (a
		// publisher made in a constructor, used in an fx.Invoke).
		if err := p.store.ready(msgs[0].Context()); err != nil {
			return fmt.Errorf("outbox: publish: %w", err)
		}
	}
	switch p.mode {
	case publishAutoCommit:
		return p.publishAutoCommit(topic, msgs)
	default:
		for i, msg := range msgs {
			tx := p.tx
			if p.mode == publishFromContext {
				var ok bool
				if tx, ok = TxFromContext(msg.Context()); !ok {
					return fmt.Errorf("outbox: publish message %d of %d: its context carries no transaction (put it there with outbox.ContextWithTx): %w", i+1, len(msgs), ErrNoTransaction)
				}
			}
			ex, err := tx.executor()
			if err != nil {
				return fmt.Errorf("outbox: publish message %d of %d: %w", i+1, len(msgs), err)
			}
			if _, err := p.store.enqueue(msg.Context(), ex, EventFromMessage(topic, msg)); err != nil {
				return fmt.Errorf("outbox: publish message %d of %d: %w", i+1, len(msgs), err)
			}
		}
		return nil
	}
}

func (p *Publisher) publishAutoCommit(topic string, msgs []*message.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	ctx := msgs[0].Context()
	tx, err := p.store.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("outbox: publish: begin: %w", err)
	}
	for i, msg := range msgs {
		if _, err := p.store.enqueue(ctx, tx, EventFromMessage(topic, msg)); err != nil {
			_ = tx.Rollback()
			return fmt.Errorf("outbox: publish message %d of %d: %w", i+1, len(msgs), err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("outbox: publish: commit: %w", err)
	}
	return nil
}

// Close stops the Publisher from accepting messages. It never commits or
// rolls back the caller's transaction.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	return nil
}

// EventFromMessage maps a Watermill message to the event it is stored as.
func EventFromMessage(topic string, msg *message.Message) Event {
	key := msg.Metadata.Get(MetadataEventKey)
	if key == "" {
		key = msg.UUID
	}
	kind := msg.Metadata.Get(MetadataKind)
	if kind == "" {
		kind = msg.Metadata.Get(MetadataCQRSName)
	}
	if kind == "" {
		kind = topic
	}
	return Event{Stream: topic, Key: key, Kind: kind, Payload: msg.Payload, Metadata: msg.Metadata,
		OrderingKey: msg.Metadata.Get(MetadataOrderingKey)}
}
