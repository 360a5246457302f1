package main

import (
	"context"
	"database/sql"
	"fmt"
	"runtime"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/outbox/mysql"
	"github.com/millpond/millpond/outbox/postgres"
	"github.com/millpond/millpond/outbox/sqlite"
)

// The dialects the bench runs on.
const (
	dialectPostgres = "postgres"
	dialectMySQL    = "mysql"
	dialectSQLite   = "sqlite"
)

// database is the run's database: a pgx pool on PostgreSQL, a *sql.DB on
// MySQL/MariaDB and SQLite.
type database struct {
	dialect string
	pool    *pgxpool.Pool // PostgreSQL
	db      *sql.DB       // MySQL, SQLite
	// rawInsert is the raw INSERT baseline's statement, prepared once on
	// SQLite (modernc.org/sqlite parses a statement run by text every
	// time; millpond prepares its enqueue's statements there too). pgx
	// prepares and caches statements itself; MySQL runs it by text.
	rawInsert *sql.Stmt
	// queue (SQLite, unless -sqlite-producers direct) runs every producer
	// transaction, of every system and of the raw INSERT baseline alike,
	// through Store.InTx of a store over the run's database: it waits in
	// the in-process write queue that the millpond stores over that
	// database share, instead of in SQLite's busy handler.
	queue *outbox.Store
}

// dialectOf tells the dialect of a database address.
func dialectOf(address string) (string, error) {
	switch {
	case strings.HasPrefix(address, "postgres://"), strings.HasPrefix(address, "postgresql://"):
		return dialectPostgres, nil
	case strings.HasPrefix(address, "mysql://"), strings.HasPrefix(address, "mariadb://"):
		return dialectMySQL, nil
	case strings.HasPrefix(address, "sqlite:"), strings.HasPrefix(address, "file:"):
		return dialectSQLite, nil
	}
	return "", fmt.Errorf("-db: give postgres://…, mysql://… or sqlite:path")
}

// openDatabase connects to the address; conns bounds the pool.
func openDatabase(ctx context.Context, address string, conns int) (*database, error) {
	dialect, err := dialectOf(address)
	if err != nil {
		return nil, err
	}
	d := &database{dialect: dialect}
	switch dialect {
	case dialectPostgres:
		if err := ensureDatabase(ctx, address); err != nil {
			return nil, err
		}
		cfg, err := pgxpool.ParseConfig(address)
		if err != nil {
			return nil, err
		}
		cfg.MaxConns = int32(conns)
		if d.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
			return nil, err
		}
	case dialectMySQL:
		dsn, err := mysql.DSN(strings.Replace(address, "mariadb://", "mysql://", 1))
		if err != nil {
			return nil, err
		}
		if d.db, err = sql.Open("mysql", dsn); err != nil {
			return nil, err
		}
		d.db.SetMaxOpenConns(conns)
		d.db.SetMaxIdleConns(conns)
	case dialectSQLite:
		path := strings.TrimPrefix(strings.TrimPrefix(address, "sqlite:"), "file:")
		path = strings.TrimPrefix(path, "//")
		var err error
		if d.db, err = sql.Open(sqlite.DriverName, sqlite.DSN(path)); err != nil {
			return nil, err
		}
		d.db.SetMaxOpenConns(conns)
		d.db.SetMaxIdleConns(conns)
	}
	if d.db != nil {
		if err := d.db.PingContext(ctx); err != nil {
			d.close()
			return nil, err
		}
	}
	return d, nil
}

func (d *database) close() {
	if d.queue != nil {
		d.queue.Close()
	}
	if d.rawInsert != nil {
		d.rawInsert.Close()
	}
	if d.pool != nil {
		d.pool.Close()
	}
	if d.db != nil {
		d.db.Close()
	}
}

// store opens a millpond Store over the run's connections.
func (d *database) store(opts ...outbox.Option) (*outbox.Store, error) {
	switch d.dialect {
	case dialectPostgres:
		return postgres.New(d.pool, opts...)
	case dialectMySQL:
		return mysql.New(d.db, opts...)
	default:
		return sqlite.New(d.db, opts...)
	}
}

// exec runs statements outside a transaction.
func (d *database) exec(ctx context.Context, query string, args ...any) error {
	if d.pool != nil {
		_, err := d.pool.Exec(ctx, query, args...)
		return err
	}
	_, err := d.db.ExecContext(ctx, query, args...)
	return err
}

// mysqlNumbers is a derived table of the numbers 0 to 999,999 in column n
// (MySQL and MariaDB; a recursive CTE would stop at MySQL's recursion
// depth of 1,000).
const mysqlNumbers = `(SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d + 100000 * h.d AS n
FROM ` + mysqlDigits + ` a, ` + mysqlDigits + ` b, ` + mysqlDigits + ` c, ` + mysqlDigits + ` e, ` + mysqlDigits + ` f, ` + mysqlDigits + ` h)`

const mysqlDigits = "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)"

// execAll runs each statement in turn (MySQL and SQLite take one at a time).
func (d *database) execAll(ctx context.Context, queries ...string) error {
	for _, q := range queries {
		if err := d.exec(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", strings.Fields(q)[0], err)
		}
	}
	return nil
}

// ph is the n-th (1-based) bind placeholder.
func (d *database) ph(n int) string {
	if d.dialect == dialectPostgres {
		return "$" + strconv.Itoa(n)
	}
	return "?"
}

// createBaseTables (re)creates the domain table every producer writes and
// the raw INSERT baseline's one-index table.
func (d *database) createBaseTables(ctx context.Context) error {
	switch d.dialect {
	case dialectPostgres:
		return d.execAll(ctx,
			`DROP TABLE IF EXISTS bench_orders, bench_plain_events`,
			`CREATE TABLE bench_orders (id bigserial PRIMARY KEY, payload text NOT NULL)`,
			`CREATE TABLE bench_plain_events (id bigserial PRIMARY KEY, payload bytea NOT NULL)`)
	case dialectMySQL:
		return d.execAll(ctx,
			`DROP TABLE IF EXISTS bench_orders, bench_plain_events`,
			`CREATE TABLE bench_orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, payload TEXT NOT NULL) ENGINE=InnoDB`,
			`CREATE TABLE bench_plain_events (id BIGINT AUTO_INCREMENT PRIMARY KEY, payload BLOB NOT NULL) ENGINE=InnoDB`)
	default:
		err := d.execAll(ctx,
			`DROP TABLE IF EXISTS bench_orders`, `DROP TABLE IF EXISTS bench_plain_events`,
			`CREATE TABLE bench_orders (id INTEGER PRIMARY KEY, payload TEXT NOT NULL)`,
			`CREATE TABLE bench_plain_events (id INTEGER PRIMARY KEY, payload BLOB NOT NULL)`)
		if err != nil || d.rawInsert != nil {
			return err
		}
		d.rawInsert, err = d.db.PrepareContext(ctx, rawInsertSQL)
		return err
	}
}

// truncate empties tables and restarts their ids. millpond_outbox (a view
// of millpond_deliveries and millpond_events since millpond's migration
// 0004) stands for those two tables.
func (d *database) truncate(ctx context.Context, tables ...string) error {
	var expanded []string
	for _, t := range tables {
		if t == "millpond_outbox" {
			expanded = append(expanded, "millpond_deliveries", "millpond_events")
			continue
		}
		expanded = append(expanded, t)
	}
	tables = expanded
	switch d.dialect {
	case dialectPostgres:
		return d.exec(ctx, `TRUNCATE `+strings.Join(tables, ", ")+` RESTART IDENTITY`)
	case dialectMySQL:
		for _, t := range tables {
			if err := d.exec(ctx, `TRUNCATE TABLE `+t); err != nil {
				return err
			}
		}
		return nil
	default:
		for _, t := range tables {
			if err := d.exec(ctx, `DELETE FROM `+t); err != nil {
				return err
			}
		}
		return nil
	}
}

// checkpoint flushes what the previous measurement left dirty, so the next
// one does not pay for it: CHECKPOINT on PostgreSQL, a truncating WAL
// checkpoint on SQLite; nothing on MySQL (InnoDB flushes in the background).
func (d *database) checkpoint(ctx context.Context) error {
	switch d.dialect {
	case dialectPostgres:
		return d.exec(ctx, `CHECKPOINT`)
	case dialectSQLite:
		return d.exec(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`)
	}
	return nil
}

// analyze refreshes the planner's statistics of millpond's tables.
func (d *database) analyze(ctx context.Context) error {
	switch d.dialect {
	case dialectPostgres:
		return d.exec(ctx, `ANALYZE millpond_events, millpond_deliveries, millpond_ordering`)
	case dialectMySQL:
		return d.exec(ctx, `ANALYZE TABLE millpond_events, millpond_deliveries, millpond_ordering`)
	}
	return d.exec(ctx, `ANALYZE`)
}

// tableBytes is the on-disk size of the tables with their indexes:
// pg_total_relation_size on PostgreSQL, data_length + index_length after
// ANALYZE TABLE on MySQL/MariaDB, the pages dbstat counts on SQLite.
func (d *database) tableBytes(ctx context.Context, tables ...string) (int64, error) {
	var total int64
	switch d.dialect {
	case dialectPostgres:
		for _, t := range tables {
			var n int64
			if err := d.pool.QueryRow(ctx, `SELECT pg_total_relation_size($1::regclass)`, t).Scan(&n); err != nil {
				return 0, err
			}
			total += n
		}
	case dialectMySQL:
		for _, t := range tables {
			if err := d.exec(ctx, "ANALYZE TABLE `"+t+"`"); err != nil {
				return 0, err
			}
			var n int64
			if err := d.db.QueryRowContext(ctx, `SELECT data_length + index_length FROM information_schema.tables
				WHERE table_schema = DATABASE() AND table_name = ?`, t).Scan(&n); err != nil {
				return 0, err
			}
			total += n
		}
	default:
		for _, t := range tables {
			var n sql.NullInt64
			if err := d.db.QueryRowContext(ctx, `SELECT sum(pgsize) FROM dbstat
				WHERE name IN (SELECT name FROM sqlite_schema WHERE tbl_name = ?)`, t).Scan(&n); err != nil {
				return 0, fmt.Errorf("dbstat: %w", err)
			}
			total += n.Int64
		}
	}
	return total, nil
}

// describe returns the facts about the run's environment that affect the
// numbers.
func (d *database) describe(ctx context.Context) (string, error) {
	host := fmt.Sprintf("%s, %s/%s, %d CPUs, GOMAXPROCS %d", runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0))
	switch d.dialect {
	case dialectPostgres:
		var version, syncCommit, sharedBuffers string
		err := d.pool.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('synchronous_commit'), current_setting('shared_buffers')`).
			Scan(&version, &syncCommit, &sharedBuffers)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("PostgreSQL %s (synchronous_commit=%s, shared_buffers=%s), %s", version, syncCommit, sharedBuffers, host), nil
	case dialectMySQL:
		var version string
		var flush, pool int64
		var iso string
		err := d.db.QueryRowContext(ctx, `SELECT VERSION(), @@innodb_flush_log_at_trx_commit, @@innodb_buffer_pool_size, @@tx_isolation`).
			Scan(&version, &flush, &pool, &iso)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("MySQL/MariaDB %s (innodb_flush_log_at_trx_commit=%d, innodb_buffer_pool_size=%d MiB, %s), %s",
			version, flush, pool>>20, iso, host), nil
	default:
		var version string
		if err := d.db.QueryRowContext(ctx, `SELECT sqlite_version()`).Scan(&version); err != nil {
			return "", err
		}
		producers := "producer transactions through outbox.Store.InTx (the stores' in-process write queue)"
		if d.queue == nil {
			producers = "producer transactions begun on the *sql.DB (waiting in SQLite's busy handler)"
		}
		return fmt.Sprintf("SQLite %s through modernc.org/sqlite (WAL, synchronous=FULL, busy_timeout 10 s, BEGIN IMMEDIATE; %s), %s", version, producers, host), nil
	}
}

// benchTx is a producer's open transaction on either driver.
type benchTx struct {
	pgx pgx.Tx
	sql *sql.Tx
	d   *database
}

// queueProducers makes producer transactions wait in the write queue of the
// millpond stores over this SQLite database (see the queue field).
func (d *database) queueProducers() error {
	q, err := sqlite.New(d.db, outbox.WithoutListen())
	if err != nil {
		return err
	}
	d.queue = q
	return nil
}

// inTx runs fn in a producer transaction, committed when fn returns nil.
func (d *database) inTx(ctx context.Context, fn func(ctx context.Context, tx *benchTx) error) error {
	if d.queue != nil {
		return d.queue.InTx(ctx, nil, func(ctx context.Context, tx *sql.Tx) error {
			return fn(ctx, &benchTx{sql: tx, d: d})
		})
	}
	tx, err := d.begin(ctx)
	if err != nil {
		return err
	}
	defer tx.rollback(context.WithoutCancel(ctx)) // no-op after Commit
	if err := fn(ctx, tx); err != nil {
		return err
	}
	return tx.commit(ctx)
}

// begin opens a producer transaction.
func (d *database) begin(ctx context.Context) (*benchTx, error) {
	if d.pool != nil {
		tx, err := d.pool.Begin(ctx)
		if err != nil {
			return nil, err
		}
		return &benchTx{pgx: tx, d: d}, nil
	}
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	return &benchTx{sql: tx, d: d}, nil
}

func (t *benchTx) exec(ctx context.Context, query string, args ...any) error {
	if t.pgx != nil {
		_, err := t.pgx.Exec(ctx, query, args...)
		return err
	}
	_, err := t.sql.ExecContext(ctx, query, args...)
	return err
}

func (t *benchTx) commit(ctx context.Context) error {
	if t.pgx != nil {
		return t.pgx.Commit(ctx)
	}
	return t.sql.Commit()
}

func (t *benchTx) rollback(ctx context.Context) {
	if t.pgx != nil {
		_ = t.pgx.Rollback(ctx)
		return
	}
	_ = t.sql.Rollback()
}

// outbox returns the transaction as millpond takes it.
func (t *benchTx) outbox() outbox.Tx {
	if t.pgx != nil {
		return outbox.PgxTx(t.pgx)
	}
	return outbox.SQLTx(t.sql)
}
