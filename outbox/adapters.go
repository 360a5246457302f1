package outbox

import (
	"context"
	"database/sql"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"

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
	beginner  wsql.Beginner
	transient func(error) bool
}

// Transient tells the core which errors abort a transaction that may be
// run again, as the driver package knows them.
func (d database) Transient(err error) bool { return d.transient != nil && d.transient(err) }

func (d database) BeginTx(ctx context.Context, opts *sql.TxOptions) (sqlcore.Tx, error) {
	tx, err := d.beginner.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return transaction{executor{tx}, tx}, nil
}

func newDatabase(b wsql.Beginner, transient func(error) bool) database {
	return database{executor{b}, b, transient}
}
