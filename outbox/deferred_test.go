package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/outbox/anydb"
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
	s := deferredSQLite(t, addr)
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

// TestDeferredStoreMethodsOpenIt: a method that takes a context, called
// before OpenDeferred (an fx.Invoke runs before the start hooks), opens
// the store with that context and works; on a store whose opening failed
// or that was closed first, it returns that error instead of running on a
// store that holds nothing.
func TestDeferredStoreMethodsOpenIt(t *testing.T) {
	addr := "sqlite:" + filepath.Join(t.TempDir(), "deferred.db")
	calls := 0
	s, err := outbox.NewDeferred("sqlite", func(ctx context.Context, opts ...outbox.Option) (*outbox.Store, error) {
		calls++
		return sqlite.Open(ctx, addr, opts...)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate before OpenDeferred: %v", err)
	}
	if err := s.RegisterGroup(ctx, "orders", "billing"); err != nil {
		t.Fatal(err)
	}
	if err := s.InTx(ctx, nil, func(ctx context.Context, tx *sql.Tx) error {
		_, err := s.Enqueue(ctx, outbox.SQLTx(tx), outbox.Event{Stream: "orders", Key: "o-1", Kind: "OrderPlaced", Payload: []byte("{}")})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.OpenDeferred(ctx); err != nil || calls != 1 {
		t.Fatalf("OpenDeferred after the methods opened the store: %v, %d opens", err, calls)
	}
	stats, err := s.Stats(ctx)
	if err != nil || len(stats) != 1 || stats[0].Pending != 1 {
		t.Fatalf("Stats: %+v, %v", stats, err)
	}

	boom := errors.New("unreachable")
	failed, err := outbox.NewDeferred("postgres", func(context.Context, ...outbox.Option) (*outbox.Store, error) { return nil, boom })
	if err != nil {
		t.Fatal(err)
	}
	if _, err := failed.Stats(ctx); !errors.Is(err, boom) {
		t.Errorf("Stats of a store that cannot open: %v, want its opening's error", err)
	}
	if _, err := failed.Claim(ctx, outbox.ClaimRequest{Stream: "orders", Worker: "w", Limit: 1, Lease: time.Minute, MaxAttempts: 1}); !errors.Is(err, boom) {
		t.Errorf("Claim of a store that cannot open: %v, want its opening's error", err)
	}
	closed, err := outbox.NewDeferred("sqlite", func(ctx context.Context, opts ...outbox.Option) (*outbox.Store, error) {
		t.Error("opened after Close")
		return sqlite.Open(ctx, addr, opts...)
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = closed.Close()
	if err := closed.Ping(ctx); !errors.Is(err, outbox.ErrNotOpened) {
		t.Errorf("Ping of a deferred store closed before it opened: %v, want ErrNotOpened", err)
	}
}

// TestDeferredStorePublishOpensIt: a Publisher made over a deferred store
// (in a constructor) and used before the start (in an fx.Invoke) opens
// the store as the store's own methods do, instead of running on a store
// that holds nothing; on a store that cannot open it returns that error.
func TestDeferredStorePublishOpensIt(t *testing.T) {
	ctx := context.Background()
	addr := "sqlite:" + filepath.Join(t.TempDir(), "deferred.db")
	migrated, err := sqlite.Open(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	if err := migrated.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	_ = migrated.Close()
	s := deferredSQLite(t, addr)
	defer s.Close()
	pub, err := outbox.NewAutoCommitPublisher(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte(`{}`))); err != nil {
		t.Fatalf("Publish before OpenDeferred: %v", err)
	}
	stats, err := s.Stats(ctx)
	if err != nil || len(stats) != 1 || stats[0].Pending != 1 {
		t.Fatalf("Stats after the publish: %+v, %v", stats, err)
	}

	boom := errors.New("unreachable")
	failed, err := outbox.NewDeferred("postgres", func(context.Context, ...outbox.Option) (*outbox.Store, error) { return nil, boom })
	if err != nil {
		t.Fatal(err)
	}
	for _, mk := range []func(*outbox.Store) (*outbox.Publisher, error){outbox.NewAutoCommitPublisher, outbox.NewContextPublisher} {
		pub, err := mk(failed)
		if err != nil {
			t.Fatal(err)
		}
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		msg.SetContext(outbox.ContextWithTx(ctx, outbox.SQLTx(nil)))
		if err := pub.Publish("orders", msg); !errors.Is(err, boom) {
			t.Errorf("Publish on a store that cannot open: %v, want its opening's error", err)
		}
	}
}

// TestDeferredStoreReadsWhileItOpens: Dialect and ListenerStatus work on a
// deferred store without opening it, so a readiness probe or a
// NewSubscriber may call them while another goroutine opens it. Opening
// must not write what they read (run with -race), and they answer the
// same before, during and after. An open function that opens a database of
// another dialect fails without changing the store's dialect.
func TestDeferredStoreReadsWhileItOpens(t *testing.T) {
	for _, dialect := range []string{"sqlite", "postgres"} {
		t.Run(dialect, func(t *testing.T) {
			db := testdb.New(t, dialect)
			s, err := outbox.NewDeferred(dialect, func(ctx context.Context, opts ...outbox.Option) (*outbox.Store, error) {
				return anydb.Open(ctx, db.URL, opts...)
			})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			wantListening := dialect == "postgres"
			stop := make(chan struct{})
			done := make(chan string, 1)
			go func() {
				for {
					if l, _ := s.ListenerStatus(); l != wantListening || s.Dialect() != dialect {
						done <- fmt.Sprintf("dialect %q, listening %t", s.Dialect(), l)
						return
					}
					select {
					case <-stop:
						done <- ""
						return
					default:
					}
				}
			}()
			err = s.OpenDeferred(context.Background())
			close(stop)
			if msg := <-done; msg != "" {
				t.Errorf("while opening: %s", msg)
			}
			if err != nil {
				t.Fatal(err)
			}
		})
	}
	addr := "sqlite:" + filepath.Join(t.TempDir(), "other.db")
	s, err := outbox.NewDeferred("postgres", func(ctx context.Context, opts ...outbox.Option) (*outbox.Store, error) {
		return sqlite.Open(ctx, addr, opts...)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.OpenDeferred(context.Background()); err == nil || !strings.Contains(err.Error(), "opened a sqlite database, want postgres") {
		t.Errorf("OpenDeferred of a sqlite database for a postgres store: %v", err)
	}
	if s.Dialect() != "postgres" || s.SQLDB() != nil {
		t.Errorf("after the failed opening: dialect %q, SQLDB %v", s.Dialect(), s.SQLDB())
	}
}

// TestDeferredStoreOpeningCutByItsCallerIsTriedAgain: a method called
// before the start with a context that ends (a readiness probe's 1 s, a
// request's) fails with that context's error, but the store is not broken
// for good: the application's start opens it.
func TestDeferredStoreOpeningCutByItsCallerIsTriedAgain(t *testing.T) {
	addr := "sqlite:" + filepath.Join(t.TempDir(), "deferred.db")
	s := deferredSQLite(t, addr)
	defer s.Close()
	probe, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Ping(probe); !errors.Is(err, context.Canceled) {
		t.Fatalf("Ping with an ended context: %v, want context.Canceled", err)
	}
	if err := s.OpenDeferred(context.Background()); err != nil {
		t.Fatalf("OpenDeferred (the start) after a probe's context ended: %v", err)
	}
	if err := s.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// deferredSQLite is a NewDeferred store that opens the SQLite database
// addr.
func deferredSQLite(t *testing.T, addr string) *outbox.Store {
	t.Helper()
	s, err := outbox.NewDeferred("sqlite", func(ctx context.Context, opts ...outbox.Option) (*outbox.Store, error) {
		return sqlite.Open(ctx, addr, opts...)
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}
