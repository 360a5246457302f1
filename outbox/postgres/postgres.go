// Package postgres opens a millpond outbox Store on PostgreSQL through
// pgx/v5. Importing it links no other database driver.
//
//	store, err := postgres.Open(ctx, "postgres://app@db:5432/app")
//	// or, over the application's own pool:
//	store, err := postgres.New(pool)
//
// Subscribers are woken by LISTEN/NOTIFY on a dedicated connection made from
// the pool's config, unless outbox.WithoutListen is given.
package postgres

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millpond/millpond/dsn"
	"github.com/millpond/millpond/internal/opening"
	"github.com/millpond/millpond/outbox"
)

// DefaultMaxConns is the pool size Open gives a pool whose address sets no
// pool_max_conns.
const DefaultMaxConns = 20

// New returns a Store over the application's pgx pool, which stays the
// caller's to close.
func New(pool *pgxpool.Pool, opts ...outbox.Option) (*outbox.Store, error) {
	return outbox.NewStore(outbox.Backend{Dialect: "postgres", Pool: pool}, opts...)
}

// Open connects to a postgres:// or postgresql:// URL or a key=value string
// and returns a Store that owns the pool (Store.Close closes it). Other
// forms are refused with an error wrapping dsn.ErrUnsupported; a database
// that cannot be reached with one wrapping outbox.ErrOpen. No error shows
// the password. It does not migrate; call Migrate.
func Open(ctx context.Context, address string, opts ...outbox.Option) (*outbox.Store, error) {
	addr, err := opening.Parse("postgres", dsn.Postgres, address)
	if err != nil {
		return nil, err
	}
	config, err := pgxpool.ParseConfig(address)
	if err != nil {
		return nil, opening.Error("postgres", addr, err)
	}
	if !strings.Contains(address, "pool_max_conns") {
		// pgxpool's default (the larger of 4 and the CPU count) is too
		// small once every subscription claims, acknowledges and extends
		// leases beside the application's own transactions.
		config.MaxConns = max(config.MaxConns, DefaultMaxConns)
	}
	pool, err := pgxpool.NewWithConfig(ctx, config)
	if err != nil {
		return nil, opening.Error("postgres", addr, err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, opening.Error("postgres", addr, err)
	}
	s, err := outbox.NewStore(outbox.Backend{Dialect: "postgres", Pool: pool, Close: func() error { pool.Close(); return nil }}, opts...)
	if err != nil {
		pool.Close()
		return nil, opening.Error("postgres", addr, err)
	}
	return s, nil
}
