package outbox_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/outbox/sqlite"
)

// TestContextPublisherNamesContextWithTx: a context publisher (the one
// fxmodule provides) given a message whose context carries no transaction
// says how to put one there, not only that a transaction is required.
func TestContextPublisherNamesContextWithTx(t *testing.T) {
	ctx := context.Background()
	store, err := sqlite.Open(ctx, "sqlite:"+filepath.Join(t.TempDir(), "pub.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	pub, err := outbox.NewContextPublisher(store)
	if err != nil {
		t.Fatal(err)
	}
	err = pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte(`{}`)))
	if !errors.Is(err, outbox.ErrNoTransaction) {
		t.Fatalf("Publish without a transaction: %v, want ErrNoTransaction", err)
	}
	if !strings.Contains(err.Error(), "outbox.ContextWithTx") {
		t.Errorf("the error does not say how to give the message its transaction: %v", err)
	}
}
