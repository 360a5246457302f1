package tests

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
)

// TestPostgresNotifyWakesSubscribersAndListenerReconnects shows that on
// PostgreSQL a commit wakes the subscriber through LISTEN/NOTIFY (the poll
// interval is set far beyond the deadline, so polling cannot explain the
// delivery), and that after the listener's connection is killed the
// listener reconnects and wake-ups resume.
func TestPostgresNotifyWakesSubscribersAndListenerReconnects(t *testing.T) {
	db := testdb.New(t, "postgres")
	// Two stores stand for two processes: the publisher's wakes no local
	// subscriber, so only NOTIFY can reach the subscriber's.
	store := db.Store(t)
	pubStore := db.Store(t, outbox.WithoutListen())
	msgs := idleSubscription(t, store, "wake")
	pub, err := outbox.NewAutoCommitPublisher(pubStore)
	if err != nil {
		t.Fatal(err)
	}
	roundTrip := func(label string) time.Duration {
		t.Helper()
		return publishAndReceive(t, pub, msgs, "wake", label, "NOTIFY did not wake it")
	}
	// An event delivered now is published again below, as a duplicate.
	dup := message.NewMessage(watermill.NewUUID(), []byte("dup"))
	if err := pub.Publish("wake", dup); err != nil {
		t.Fatal(err)
	}
	select {
	case msg := <-msgs:
		msg.Ack()
	case <-time.After(5 * time.Second):
		t.Fatal("the first event was not delivered")
	}
	// After Subscribe (and after each wake-up) the subscriber polls at 1, 3,
	// 7, ... 2047, 4095 ms as its claims come back empty. Three seconds in,
	// its next poll is more than a second away, so a delivery within 500 ms
	// can only come from a notification.
	time.Sleep(3 * time.Second)
	// A refused event right before must not use up the notification the
	// next enqueue sends (they are at most 10 ms apart per stream).
	if err := pub.Publish("wake", message.NewMessage("", []byte("no key"))); err == nil {
		t.Fatal("a message without a UUID (the event key) was accepted")
	}
	// Nor must a duplicate, which inserts nothing and so sends nothing.
	if err := pub.Publish("wake", message.NewMessage(dup.UUID, []byte("dup"))); err != nil {
		t.Fatal(err)
	}
	t.Logf("commit to handler before the kill: %s", roundTrip("before"))

	// Kill the listener's connection.
	var killed int64
	if err := db.Pool.QueryRow(context.Background(),
		`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		 WHERE application_name = $1 AND query LIKE 'LISTEN%'`, db.Name).Scan(&killed); err != nil {
		t.Fatal(err)
	}
	if killed != 1 {
		t.Fatalf("terminated %d listener connections, want 1", killed)
	}
	// Reconnection wakes every subscriber once; let that pass, then prove
	// that notifications flow again.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var listening int64
		if err := db.Pool.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN%'`, db.Name).Scan(&listening); err != nil {
			t.Fatal(err)
		}
		if listening == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the listener did not reconnect within 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(3 * time.Second)
	t.Logf("commit to handler after the reconnect: %s", roundTrip("after"))
}
