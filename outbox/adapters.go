package outbox

import (
	"context"
	"database/sql"
	"reflect"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millpond/millpond/internal/sqlcore"
)

// The store reuses watermill-sql's adapters between pgx/v5, database/sql and
// its executor interfaces; these two small types only restate their results
// as the internal core's interfaces.

type executor struct{ wsql.ContextExecutor }

func (e executor) ExecContext(ctx context.Context, query string, args ...any) (sqlcore.Result, error) {
	return e.ContextExecutor.ExecContext(ctx, query, args...)
}

func (e executor) QueryContext(ctx context.Context, query string, args ...any) (sqlcore.Rows, error) {
	return e.ContextExecutor.QueryContext(ctx, query, args...)
}

type transaction struct {
	executor
	tx wsql.Tx
}

func (t transaction) Commit() error   { return t.tx.Commit() }
func (t transaction) Rollback() error { return t.tx.Rollback() }

type database struct {
	executor
	beginner wsql.Beginner
}

func (d database) BeginTx(ctx context.Context, opts *sql.TxOptions) (sqlcore.Tx, error) {
	tx, err := d.beginner.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return transaction{executor{tx}, tx}, nil
}

func newDatabase(b wsql.Beginner) database { return database{executor{b}, b} }

// txExecutor turns the caller's open transaction into an executor, and
// refuses pools and connections: the outbox never opens a transaction of its
// own for an enqueue. A nil transaction, typed or not (var tx *pgxpool.Tx),
// is refused with ErrNoTransaction rather than dereferenced.
func txExecutor(tx any) (sqlcore.Executor, error) {
	if isNil(tx) {
		return nil, ErrNoTransaction
	}
	switch t := tx.(type) {
	case pgx.Tx:
		return executor{wsql.TxFromPgx(t)}, nil
	case *sql.Tx:
		return executor{wsql.TxFromStdSQL(t)}, nil
	case *sql.DB, *sql.Conn, *pgxpool.Pool, *pgx.Conn, *pgxpool.Conn, wsql.Beginner:
		return nil, ErrNoTransaction
	case wsql.ContextExecutor:
		return executor{t}, nil
	default:
		return nil, ErrUnsupportedTx
	}
}

// isNil reports whether v is nil or a nil pointer, map, slice, channel,
// function or interface held in an interface (a "typed nil").
func isNil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Chan, reflect.Func, reflect.Interface, reflect.UnsafePointer:
		return rv.IsNil()
	}
	return false
}
