package tests

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// TestPublisherErrorsHoldNoEventKey: an outbox message's UUID is its event
// key (customer data, often), so the Publisher's errors and
// AcknowledgeMessageInTx's refusals, which a Watermill router logs, name a
// message by its place in the batch or its event id, never by its UUID.
func TestPublisherErrorsHoldNoEventKey(t *testing.T) {
	for _, dialect := range testdb.Dialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, dialect)
			store := db.Store(t)
			ctx := context.Background()
			const key = "customer-ada.lovelace.example.com"
			newMsg := func(payload string) *message.Message {
				m := message.NewMessage(key, []byte(payload))
				m.Metadata.Set(outbox.MetadataKind, "SignedUp")
				return m
			}
			hidesKey := func(what string, err, target error) {
				t.Helper()
				if !errors.Is(err, target) {
					t.Fatalf("%s: %v, want %v", what, err, target)
				}
				if strings.Contains(err.Error(), key) {
					t.Errorf("%s: the error shows the event key: %v", what, err)
				}
			}

			auto, err := outbox.NewAutoCommitPublisher(store)
			if err != nil {
				t.Fatal(err)
			}
			if err := auto.Publish("signups", newMsg(`{"n":1}`)); err != nil {
				t.Fatal(err)
			}
			// The same key with other content, second in its batch.
			other := message.NewMessage("another-key", []byte(`{}`))
			other.Metadata.Set(outbox.MetadataKind, "SignedUp")
			err = auto.Publish("signups", other, newMsg(`{"n":2}`))
			hidesKey("idempotency conflict", err, outbox.ErrIdempotencyConflict)
			if !strings.Contains(err.Error(), "publish message 2 of 2") {
				t.Errorf("the conflict error does not say which message: %v", err)
			}

			tx, _, rollback := db.Begin(t)
			defer rollback()
			pub, err := outbox.NewPublisher(store, tx)
			if err != nil {
				t.Fatal(err)
			}
			hidesKey("idempotency conflict in a transaction", pub.Publish("signups", newMsg(`{"n":3}`)), outbox.ErrIdempotencyConflict)

			ctxPub, err := outbox.NewContextPublisher(store)
			if err != nil {
				t.Fatal(err)
			}
			hidesKey("no transaction", ctxPub.Publish("signups", newMsg(`{}`)), outbox.ErrNoTransaction)

			undelivered := newMsg(`{}`)
			hidesKey("AcknowledgeMessageInTx", outbox.AcknowledgeMessageInTx(ctx, tx, undelivered), outbox.ErrNoReceipt)
			hidesKey("Store.AcknowledgeMessageInTx", store.AcknowledgeMessageInTx(ctx, tx, undelivered), outbox.ErrNoReceipt)
		})
	}
}
