package tests

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// TestSubscriberRefusesBadInput: every SubscriberConfig value out of its
// bounds is refused with a typed error, and so is a topic that cannot be a
// stream, also when SkipRegistration skips the registration that used to be
// its only check (its claims then failed and retried forever).
func TestSubscriberRefusesBadInput(t *testing.T) {
	db := testdb.New(t, "sqlite")
	store := db.Store(t)
	for name, c := range map[string]struct {
		cfg  outbox.SubscriberConfig
		want error
	}{
		"negative PollInterval":   {outbox.SubscriberConfig{PollInterval: -time.Second}, outbox.ErrInvalidDuration},
		"PollInterval 1µs":        {outbox.SubscriberConfig{PollInterval: time.Microsecond}, outbox.ErrInvalidDuration},
		"negative CloseTimeout":   {outbox.SubscriberConfig{CloseTimeout: -time.Second}, outbox.ErrInvalidDuration},
		"negative MaxInFlight":    {outbox.SubscriberConfig{MaxInFlight: -2000}, outbox.ErrInvalidBatch},
		"bad consumer group":      {outbox.SubscriberConfig{ConsumerGroup: "bill ing"}, outbox.ErrInvalidKey},
		"lease below the minimum": {outbox.SubscriberConfig{Lease: time.Millisecond}, outbox.ErrInvalidLease},
	} {
		if _, err := outbox.NewSubscriber(store, c.cfg); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}

	for _, skip := range []bool{false, true} {
		sub, err := outbox.NewSubscriber(store, outbox.SubscriberConfig{ConsumerGroup: "billing", SkipRegistration: skip})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		if ch, err := sub.Subscribe(ctx, "orders with spaces!"); !errors.Is(err, outbox.ErrInvalidKey) || ch != nil {
			t.Errorf("SkipRegistration %v: Subscribe of an invalid topic: %v, want ErrInvalidKey", skip, err)
		}
		if err := sub.SubscribeInitialize("orders with spaces!"); !errors.Is(err, outbox.ErrInvalidKey) {
			t.Errorf("SkipRegistration %v: SubscribeInitialize of an invalid topic: %v, want ErrInvalidKey", skip, err)
		}
		cancel()
		if err := sub.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
