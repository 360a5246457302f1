package outbox_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/outbox/sqlite"
)

func TestDeferredStoreOpensOnceOnStart(t *testing.T) {
	addr := "sqlite:" + filepath.Join(t.TempDir(), "deferred.db")
	calls := 0
	open := func(ctx context.Context, opts ...outbox.Option) (*outbox.Store, error) {
		calls++
		return sqlite.Open(ctx, addr, opts...)
	}
	s, err := outbox.NewDeferred("sqlite", open)
	if err != nil {
		t.Fatal(err)
	}
	if calls != 0 || s.Dialect() != "sqlite" {
		t.Fatalf("before opening: %d opens, dialect %q", calls, s.Dialect())
	}
	ctx := context.Background()
	if err := s.OpenDeferred(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.OpenDeferred(ctx); err != nil || calls != 1 {
		t.Fatalf("second OpenDeferred: %v, %d opens", err, calls)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if s.SQLDB() == nil {
		t.Fatal("no SQLDB once opened")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestDeferredStoreSQLDBOpensOnDemand(t *testing.T) {
	addr := "sqlite:" + filepath.Join(t.TempDir(), "deferred.db")
	s, err := outbox.NewDeferred("sqlite", func(ctx context.Context, opts ...outbox.Option) (*outbox.Store, error) {
		return sqlite.Open(ctx, addr, opts...)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	db := s.SQLDB() // a constructor taking it before the start: opens the store
	if db == nil {
		t.Fatal("SQLDB before OpenDeferred returned nil")
	}
	if err := db.Ping(); err != nil {
		t.Fatal(err)
	}
	if err := s.OpenDeferred(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s.SQLDB() != db {
		t.Fatal("SQLDB changed once the store opened")
	}
}

func TestDeferredStoreRefusesMisuse(t *testing.T) {
	addr := "sqlite:" + filepath.Join(t.TempDir(), "deferred.db")
	if _, err := outbox.NewDeferred("oracle", nil); err == nil {
		t.Error("an unknown dialect was accepted")
	}
	// An open function that drops the options opens a store of its own,
	// which is closed, and the deferred store reports it.
	s, err := outbox.NewDeferred("sqlite", func(ctx context.Context, _ ...outbox.Option) (*outbox.Store, error) {
		return sqlite.Open(ctx, addr)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.OpenDeferred(context.Background()); err == nil {
		t.Error("an open function that dropped its options was accepted")
	}
	// Closed before it opened: it never opens.
	s, err = outbox.NewDeferred("sqlite", func(ctx context.Context, opts ...outbox.Option) (*outbox.Store, error) {
		t.Error("opened after Close")
		return sqlite.Open(ctx, addr, opts...)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.OpenDeferred(context.Background()); !errors.Is(err, outbox.ErrNotOpened) {
		t.Errorf("OpenDeferred after Close: %v, want ErrNotOpened", err)
	}
	// A failed opening is reported again, not retried.
	boom := errors.New("unreachable")
	s, err = outbox.NewDeferred("postgres", func(context.Context, ...outbox.Option) (*outbox.Store, error) { return nil, boom })
	if err != nil {
		t.Fatal(err)
	}
	if s.SQLDB() != nil || s.Pool() != nil {
		t.Error("a store that failed to open has a database")
	}
	if err := s.OpenDeferred(context.Background()); !errors.Is(err, boom) {
		t.Errorf("OpenDeferred after a failed opening: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close of a store that never opened: %v", err)
	}
}
