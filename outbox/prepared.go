package outbox

import (
	"context"
	"database/sql"
	"sync"
	"sync/atomic"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"

	"github.com/millpond/millpond/internal/sqlcore"
)

// Statements prepared once and reused, for the enqueue's fixed statements
// in the caller's transaction (enabled on SQLite, where parsing a statement
// was about half of the enqueue's CPU: modernc.org/sqlite parses every
// statement run by text again, and caches nothing between calls).
//
// A statement is prepared on the store's *sql.DB, in the background the
// first time it is needed: preparing takes a connection from the pool, and
// the caller's transaction may hold the last one (a SQLite pool is often
// one connection), so the caller never waits for it; until it is ready the
// statement runs by its text. Inside a transaction, Tx.StmtContext binds it
// to the transaction's connection; database/sql prepares it there once per
// connection and reuses it for every later transaction on that connection.
// A transaction of another *sql.DB cannot use it: database/sql refuses it,
// and the statement then runs by its text.

// stmtCache holds the statements prepared on one *sql.DB, by text. Only the
// texts it was made with are prepared.
type stmtCache struct {
	db      *sql.DB
	entries map[string]*preparedStmt // fixed when made: read without a lock
	ctx     context.Context          // ends with Close: stops preparations under way
	cancel  context.CancelFunc

	mu     sync.Mutex
	closed bool
}

// preparedStmt is one statement of a stmtCache.
type preparedStmt struct {
	stmt      atomic.Pointer[sql.Stmt] // nil until prepared
	preparing atomic.Bool              // a preparation is under way
	failedAt  atomic.Int64             // unix nanoseconds of the last failed preparation
	// busy is set while the statement runs or its rows are open: a
	// connection's prepared statement runs one execution at a time, so a
	// second use meanwhile (two goroutines sharing one transaction) runs by
	// text instead.
	busy atomic.Bool
}

// retryPrepareAfter spaces the preparations of a statement that failed to
// prepare (say, before the schema was migrated).
const retryPrepareAfter = time.Second

// newStmtCache returns a cache that prepares the given texts on db.
func newStmtCache(db *sql.DB, texts []string) *stmtCache {
	c := &stmtCache{db: db, entries: make(map[string]*preparedStmt, len(texts))}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	for _, t := range texts {
		c.entries[t] = &preparedStmt{}
	}
	return c
}

// get returns the prepared statement of text, marked busy, or nil when
// text is not one of the cache's, is not prepared yet (its preparation is
// then started) or is busy. A non-nil result must be given back with done.
func (c *stmtCache) get(text string) (*sql.Stmt, *preparedStmt) {
	p := c.entries[text]
	if p == nil {
		return nil, nil
	}
	stmt := p.stmt.Load()
	if stmt == nil {
		c.prepare(text, p)
		return nil, nil
	}
	if !p.busy.CompareAndSwap(false, true) {
		return nil, nil
	}
	return stmt, p
}

func (p *preparedStmt) done() { p.busy.Store(false) }

// prepare starts preparing text in the background, unless it is already
// under way or failed less than retryPrepareAfter ago.
func (c *stmtCache) prepare(text string, p *preparedStmt) {
	if last := p.failedAt.Load(); last != 0 && time.Since(time.Unix(0, last)) < retryPrepareAfter {
		return
	}
	if !p.preparing.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer p.preparing.Store(false)
		stmt, err := c.db.PrepareContext(c.ctx, text)
		if err != nil {
			p.failedAt.Store(time.Now().UnixNano())
			return
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.closed {
			_ = stmt.Close()
			return
		}
		p.stmt.Store(stmt)
	}()
}

// close stops preparations under way and closes the prepared statements
// (database/sql finalizes each once the transactions using it end).
func (c *stmtCache) close() {
	if c == nil {
		return
	}
	c.cancel()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for _, p := range c.entries {
		if s := p.stmt.Swap(nil); s != nil {
			_ = s.Close()
		}
	}
}

// errForeignStmt is the text of database/sql's refusal of a statement
// prepared on another *sql.DB (Tx.StmtContext); it has no sentinel error.
const errForeignStmt = "sql: Tx.Stmt: statement from different database used"

// preparedTx runs the cache's statements prepared in a database/sql
// transaction, and every other statement by text.
type preparedTx struct {
	executor
	tx    *sql.Tx
	cache *stmtCache
}

// withPrepared returns ex running the cache's statements prepared, when ex
// is a database/sql transaction; otherwise ex itself.
func withPrepared(ex sqlcore.Executor, cache *stmtCache) sqlcore.Executor {
	if cache == nil {
		return ex
	}
	var e executor
	switch v := ex.(type) {
	case executor:
		e = v
	case transaction:
		e = v.executor
	default:
		return ex
	}
	t, ok := e.ContextExecutor.(*wsql.StdSQLTx)
	if !ok || t == nil || t.Tx == nil {
		return ex
	}
	return preparedTx{executor: e, tx: t.Tx, cache: cache}
}

func (p preparedTx) ExecContext(ctx context.Context, query string, args ...any) (sqlcore.Result, error) {
	stmt, ps := p.cache.get(query)
	if ps == nil {
		return p.executor.ExecContext(ctx, query, args...)
	}
	defer ps.done()
	res, err := p.tx.StmtContext(ctx, stmt).ExecContext(ctx, args...)
	if isForeign(err) {
		return p.executor.ExecContext(ctx, query, args...)
	}
	return res, err
}

func (p preparedTx) QueryContext(ctx context.Context, query string, args ...any) (sqlcore.Rows, error) {
	stmt, ps := p.cache.get(query)
	if ps == nil {
		return p.executor.QueryContext(ctx, query, args...)
	}
	rows, err := p.tx.StmtContext(ctx, stmt).QueryContext(ctx, args...)
	if err != nil {
		ps.done()
		if isForeign(err) {
			return p.executor.QueryContext(ctx, query, args...)
		}
		return nil, err
	}
	return &preparedRows{Rows: rows, ps: ps}, nil
}

func isForeign(err error) bool { return err != nil && err.Error() == errForeignStmt }

// preparedRows gives the statement back when the rows are closed.
type preparedRows struct {
	*sql.Rows
	ps   *preparedStmt
	once sync.Once
}

func (r *preparedRows) Close() error {
	err := r.Rows.Close()
	r.once.Do(r.ps.done)
	return err
}
