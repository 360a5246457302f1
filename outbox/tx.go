package outbox

import (
	"database/sql"
	"reflect"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/jackc/pgx/v5"

	"github.com/millpond/millpond/internal/sqlcore"
)

// Tx is the application's open transaction, in which the outbox writes
// (Store.Enqueue, Store.AcknowledgeInTx, NewPublisher, ContextWithTx).
// Make one with SQLTx from a *sql.Tx (every dialect) or PgxTx from a pgx.Tx
// (PostgreSQL). Pools and connections cannot be made into a Tx, so the
// compiler refuses them: the outbox never writes outside the caller's
// transaction. The zero Tx, and one made from a nil transaction (typed or
// not), is refused with ErrNoTransaction when used.
type Tx struct {
	ex sqlcore.Executor
}

// SQLTx wraps a database/sql transaction, on any dialect (on PostgreSQL,
// begin it on Store.SQLDB).
func SQLTx(tx *sql.Tx) Tx {
	if tx == nil {
		return Tx{}
	}
	return Tx{ex: executor{wsql.TxFromStdSQL(tx)}}
}

// PgxTx wraps a pgx transaction (from pgxpool.Pool.Begin, pgx.Conn.Begin
// or pgx.BeginFunc), on PostgreSQL.
func PgxTx(tx pgx.Tx) Tx {
	if isNil(tx) {
		return Tx{}
	}
	return Tx{ex: executor{wsql.TxFromPgx(tx)}}
}

// WatermillSQLTx wraps a watermill-sql transaction (from the BeginTx of a
// watermill-sql Beginner), for code that already works with watermill-sql's
// adapters.
func WatermillSQLTx(tx wsql.Tx) Tx {
	if isNil(tx) {
		return Tx{}
	}
	return Tx{ex: executor{tx}}
}

// executor returns the transaction's executor, or ErrNoTransaction.
func (t Tx) executor() (sqlcore.Executor, error) {
	if t.ex == nil {
		return nil, ErrNoTransaction
	}
	return t.ex, nil
}

// isNil reports a nil interface or an interface holding a nil pointer (a
// `var tx *pgxpool.Tx` passed as pgx.Tx), which would panic on first use.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.UnsafePointer:
		return rv.IsNil()
	}
	return false
}
