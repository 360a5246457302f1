package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/millpond/millpond/internal/sqlcore"
)

// Store is the durable outbox over one database. It is safe for concurrent
// use. Create it with a driver package (outbox/postgres, outbox/mysql,
// outbox/sqlite) or outbox/anydb; install the schema with Migrate (never
// implicit).
type Store struct {
	core   *sqlcore.Core
	db     sqlcore.DB
	pool   *pgxpool.Pool // PostgreSQL only
	logger *slog.Logger
	closer func() error
	wake   *wakeHub
	gate   *notifyGate
	stmts  *stmtCache // SQLite: the enqueue's statements, prepared once (nil elsewhere)
	writes *writeGate // SQLite: the write queue the store's statements and InTx take turns in (nil elsewhere)

	mu       sync.Mutex
	closed   bool
	stop     context.CancelFunc
	listener sync.WaitGroup // the PostgreSQL listener goroutine
	sqlDB    *sql.DB        // PostgreSQL: database/sql over the pool, made on first use

	tel        *telemetry  // metrics and traces
	statsCache statsCache  // the snapshot behind the gauges and CachedStats
	listenerUp atomic.Bool // the PostgreSQL listener is connected
	schemaOK   atomic.Bool // CheckSchema found the schema current

	// heldBudget has room for the held claims the store's subscribers
	// may keep open at once (PostgreSQL and MySQL; see heldBudget).
	heldBudget chan struct{}
	// heldDelivery is the message context value of a held event of the
	// store's subscribers (see subscription.heldContext).
	heldDelivery any

	dialect  sqlcore.Dialect
	deferred *deferredOpen // NewDeferred's store: how and whether it opened
}

// Option configures a Store.
type Option func(*storeOptions)

type storeOptions struct {
	clock       func() time.Time
	logger      *slog.Logger
	listen      bool
	notifyEvery time.Duration
	deleteOnAck bool
	lockTimeout time.Duration

	meterProvider  metric.MeterProvider
	tracerProvider trace.TracerProvider
	propagator     propagation.TextMapPropagator
	statsInterval  time.Duration

	into *Store // NewDeferred: the Store to open into instead of a new one
}

// WithClock replaces the database clock for tests that need fixed time.
func WithClock(now func() time.Time) Option {
	return func(o *storeOptions) { o.clock = now }
}

// WithLogger sets the logger for background work (the PostgreSQL listener)
// and for statements the database aborted to resolve a lock conflict (a
// deadlock or serialization failure), which the store retries with a short
// backoff. The default discards logs.
func WithLogger(l *slog.Logger) Option {
	return func(o *storeOptions) { o.logger = l }
}

// WithoutListen turns off PostgreSQL LISTEN/NOTIFY wake-ups; subscribers
// then rely on polling alone.
func WithoutListen() Option {
	return func(o *storeOptions) { o.listen = false }
}

// DefaultNotifyEvery is the least time between two PostgreSQL NOTIFYs a
// Store sends per quiet stream, unless WithNotifyEvery sets another.
const DefaultNotifyEvery = 3 * time.Millisecond

// WithNotifyEvery sets how often, at most, the Store sends a PostgreSQL
// NOTIFY per stream from enqueueing transactions while the stream is quiet
// (default DefaultNotifyEvery; negative never): its last NOTIFY has come
// back to the Store's listener (its transaction committed) and at most one
// enqueue since went without one. A busy stream's NOTIFYs go every 10 ms,
// or every d when longer. PostgreSQL serialises the commits of notifying
// transactions, so notifying on every enqueue of overlapping transactions
// would halve producer throughput, while a producer that commits one event
// at a time, at least d apart, notifies for each. Subscribers woken by one
// notification poll quickly for a while and so also find the events of
// the transactions that did not notify.
func WithNotifyEvery(d time.Duration) Option {
	return func(o *storeOptions) { o.notifyEvery = d }
}

// WithDeleteOnAck makes acknowledgements delete the acknowledged delivery
// row instead of marking it delivered: with it, an acknowledged event
// leaves no delivery history for its consumer group (like watermill-sql's
// DeleteOnAck, which deletes an acknowledged message instead of marking it
// acked). Every acknowledgement of the store (Acknowledge, AcknowledgeInTx,
// Subscriber, bus and relay) deletes, with the same checks and results:
// only receipts that still own their event under a live lease take
// effect, the others are reported stale. Ordering keys work as before.
//
// The event itself (millpond_events, its key, kind, payload and metadata)
// stays until Purge: it is the idempotency key, so enqueueing an
// acknowledged key again delivers nothing and returns Inserted false with
// the lowest delivery row id the event has left (another group's), or ID
// 0 when it has none (the event is known; every row is gone). With
// this option Purge also deletes events created more than its horizon ago
// that no delivery row points at, and discarding or moving delivery rows
// (DiscardDead, RetireGroup, Reroute) leaves their events to Purge as well.
//
// What operators see: FindEvents, ListGroups' delivered counts and last
// acknowledgement, Stats and the millpond_outbox view show no acknowledged
// rows of this store (FindEvents returns nothing for an event whose rows
// are all acknowledged); rows delivered before the option was set remain
// until Purge. On PostgreSQL an acknowledgement that deletes writes about
// a sixth of the WAL of one that updates (the update changes an indexed
// column, so it cannot be a heap-only update). Use the option on every
// Store over the same tables, or none.
func WithDeleteOnAck() Option {
	return func(o *storeOptions) { o.deleteOnAck = true }
}

// DefaultMigrationLockTimeout is how long Migrate and MigrateDown wait, at
// most, for each lock on a table, unless WithMigrationLockTimeout sets
// another.
const DefaultMigrationLockTimeout = sqlcore.DefaultMigrationLockTimeout

// WithMigrationLockTimeout bounds each wait of Migrate and MigrateDown for
// a lock on a table (default DefaultMigrationLockTimeout; d <= 0 keeps the
// default). A migration that waits for a table lock (migration 0004 locks
// millpond_outbox, or renames it on MySQL and MariaDB) holds up every
// other session of the table behind its pending request, so a long
// transaction of a replica still running would otherwise stall the
// application for as long as it lasts. When a wait times out, the try is
// rolled back and run again after a backoff (from d, doubling, at most
// 30 s), with a warning to the WithLogger logger, until Migrate's context
// ends; it then returns an error wrapping ErrMigrationLockTimeout (once a
// try has timed out; a context that ends during the first wait gives the
// context's error alone). Other
// sessions are held up at most d at a time. PostgreSQL uses it as the
// migration transaction's lock_timeout; MySQL and MariaDB as the
// migration session's lock_wait_timeout and innodb_lock_wait_timeout, in
// whole seconds (rounded up), restored afterwards. SQLite's busy timeout
// already bounds its wait, which holds up no one; a try it ends is run
// again the same way.
func WithMigrationLockTimeout(d time.Duration) Option {
	return func(o *storeOptions) { o.lockTimeout = d }
}

func buildOptions(opts []Option) storeOptions {
	o := storeOptions{listen: true, logger: slog.New(slog.DiscardHandler), notifyEvery: DefaultNotifyEvery, statsInterval: DefaultStatsInterval}
	for _, opt := range opts {
		opt(&o)
	}
	if o.statsInterval == 0 {
		o.statsInterval = DefaultStatsInterval
	}
	return o
}

func newStore(d sqlcore.Dialect, db sqlcore.DB, o storeOptions) (*Store, error) {
	if o.into != nil && o.into.dialect != d {
		// Checked before anything is written into the deferred store, whose
		// Dialect is read without a lock.
		return nil, fmt.Errorf("outbox: open deferred store: opened a %s database, want %s", d, o.into.dialect)
	}
	logger := o.logger
	coreOpts := []sqlcore.Option{sqlcore.WithConflictObserver(func(what string, err error, wait time.Duration) {
		// Rare once every statement locks rows in id order; worth seeing.
		logger.Warn("outbox: the database aborted a statement to resolve a lock conflict; retrying",
			"operation", what, "error", err, "retry_in", wait.Round(time.Microsecond).String())
	})}
	if o.clock != nil {
		coreOpts = append(coreOpts, sqlcore.WithClock(o.clock))
	}
	if o.deleteOnAck {
		coreOpts = append(coreOpts, sqlcore.WithDeleteOnAck())
	}
	if o.lockTimeout > 0 {
		coreOpts = append(coreOpts, sqlcore.WithMigrationLockTimeout(o.lockTimeout))
	}
	core, err := sqlcore.New(d, db, coreOpts...)
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	tel, err := newTelemetry(o)
	if err != nil {
		return nil, err
	}
	s := o.into
	if s == nil {
		// NewDeferred's store keeps its dialect (the same: checked above)
		// and the hub its subscribers hold: Dialect, ListenerStatus and
		// NewSubscriber read them without a lock while it opens.
		s = &Store{dialect: d, wake: newWakeHub()}
	}
	s.core, s.db, s.logger, s.gate, s.tel = core, db, o.logger, newNotifyGate(o.notifyEvery), tel
	s.statsCache.interval = o.statsInterval
	if o.statsInterval > 0 {
		if err := tel.registerGauges(o.meterProvider, s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Backend is one database connection as a driver package hands it to
// NewStore. Applications do not build it: they call postgres.New or
// postgres.Open (package outbox/postgres), mysql.New or mysql.Open
// (outbox/mysql), sqlite.New or sqlite.Open (outbox/sqlite), or
// anydb.Open (outbox/anydb) for any address. Keeping each database driver in
// its own package means a program links only the drivers it imports.
type Backend struct {
	// Dialect is "postgres", "mysql" or "sqlite".
	Dialect string
	// Pool is the pgx pool of a PostgreSQL backend (nil otherwise). Its
	// config also makes the connection that LISTENs for wake-ups.
	Pool *pgxpool.Pool
	// DB is the database/sql handle of a MySQL or SQLite backend (nil for
	// PostgreSQL).
	DB *sql.DB
	// Transient reports whether an error aborted a whole transaction that
	// may simply be run again (a MySQL deadlock or lock wait timeout,
	// SQLite's busy database). PostgreSQL's deadlock and serialization
	// failures are recognised without it. May be nil.
	Transient func(error) bool
	// Close closes what the driver package opened for the store (Open's
	// pool or database), run by Store.Close; nil when the caller owns the
	// connection.
	Close func() error
}

// NewStore returns a Store over a driver package's backend. Use the driver
// packages' New and Open instead of calling it directly.
func NewStore(b Backend, opts ...Option) (*Store, error) {
	d := sqlcore.Dialect(b.Dialect)
	if !d.Valid() {
		return nil, fmt.Errorf("outbox: unknown dialect %q (want postgres, mysql or sqlite)", b.Dialect)
	}
	o := buildOptions(opts)
	var beginner wsql.Beginner
	var gate *writeGate
	switch {
	case d == sqlcore.Postgres && b.Pool == nil:
		return nil, errors.New("outbox: nil pgx pool")
	case d == sqlcore.Postgres:
		beginner = wsql.BeginnerFromPgx(b.Pool)
	case b.DB == nil:
		return nil, errors.New("outbox: nil database")
	default:
		beginner = wsql.BeginnerFromStdSQL(b.DB)
		if d == sqlcore.SQLite {
			gate = gateFor(b.DB)
		}
	}
	s, err := newStore(d, newDatabase(beginner, b.Transient, gate), o)
	if err != nil {
		return nil, err
	}
	s.pool, s.sqlDB, s.closer, s.writes = b.Pool, b.DB, b.Close, gate
	s.heldDelivery = delivery{store: s, held: true}
	switch {
	case b.Pool != nil:
		s.heldBudget = make(chan struct{}, heldBudget(int(b.Pool.Config().MaxConns)))
	case d == sqlcore.MySQL:
		s.heldBudget = make(chan struct{}, heldBudget(b.DB.Stats().MaxOpenConnections))
	}
	if d == sqlcore.SQLite {
		s.stmts = newStmtCache(b.DB, s.core.EnqueueStatements())
	}
	if d == sqlcore.Postgres && o.listen {
		ctx, cancel := context.WithCancel(context.Background())
		s.stop = cancel
		if !s.wake.listening { // NewDeferred set it already: no write to race its readers
			s.wake.listening = true
		}
		s.listener.Add(1)
		go func() {
			defer s.listener.Done()
			sqlcore.ListenPostgres(ctx, b.Pool.Config().ConnConfig, func(stream string) {
				if stream == "" { // sent after every (re)connection
					s.listenerUp.Store(true)
				}
				s.gate.seen(stream)
				s.wake.notify(stream)
			}, func(err error) {
				s.listenerUp.Store(false)
				s.logger.Warn("outbox: notification listener reconnecting", "error", err)
			})
		}()
	}
	return s, nil
}

// SQLDB returns a database/sql handle on the store's own connections, for
// the application's domain writes in the same transaction as its events:
// the *sql.DB of a MySQL or SQLite store, or on PostgreSQL a handle over
// the pgx pool (pgx's stdlib.OpenDBFromPool).
func (s *Store) SQLDB() *sql.DB {
	s.openOnDemand()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sqlDB == nil && s.pool != nil {
		s.sqlDB = stdlib.OpenDBFromPool(s.pool)
	}
	return s.sqlDB
}

// Pool returns the pgx pool of a PostgreSQL store, or nil.
func (s *Store) Pool() *pgxpool.Pool {
	s.openOnDemand()
	return s.pool
}

// Dialect names the store's database: "postgres", "mysql" or "sqlite".
func (s *Store) Dialect() string { return string(s.dialect) }

// Close stops the store's background work and closes a database that Open
// opened. It does not close a pool or database the caller handed to a
// driver package's New.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closeLocked()
}

// closeLocked is Close; the caller holds s.mu.
func (s *Store) closeLocked() error {
	if s.closed {
		return nil
	}
	s.closed = true
	if !s.deferredOpened() {
		return nil // a NewDeferred store that never opened holds nothing
	}
	s.tel.close()
	s.stmts.close()
	if s.stop != nil {
		s.stop()
		s.listener.Wait()
	}
	if s.pool != nil && s.sqlDB != nil {
		_ = s.sqlDB.Close() // the handle over the pool; the pool stays open
	}
	if s.closer != nil {
		if s.sqlDB != nil {
			gates.Delete(s.sqlDB) // the database closes with the store: drop its write gate
		}
		return s.closer()
	}
	return nil
}

// Migrate installs or upgrades the outbox schema. It is idempotent and safe
// to run from several processes at once: they take turns under a lock of
// the database (on MySQL a named lock carrying the database's name, waited
// for as long as ctx allows, so give a long migration a long context). It
// records the applied steps in its own table; migrate a database with it or
// with an external tool (see MigrationsFS), not both.
//
// Each wait for a lock on a table is bounded (WithMigrationLockTimeout):
// while a transaction of another session holds the table, Migrate rolls
// its try back and tries again after a backoff, so the application's
// statements queued behind it run, until ctx ends. Once a try has timed
// out, it then returns an error wrapping ErrMigrationLockTimeout, and the
// schema stays at the version it had (on MySQL and MariaDB, with the steps
// completed before). Give it a context with a deadline. On MySQL and
// MariaDB, whose server runs on a statement its client gave up, a statement
// under way when ctx ends runs to its end (a lock wait at most the lock
// timeout) before Migrate returns, so nothing of the migration runs after
// it returned.
//
// Replicas that start together migrate one at a time: each waits for the
// database's migration lock (PostgreSQL: an advisory lock; MySQL and
// MariaDB: a named lock), and the next one finds the steps applied. One
// whose context ends during that wait returns an error wrapping
// ErrMigrationInProgress. SQLite has no such lock: a migration waits for
// the database's single writer, whoever that is, as any write does, and
// one whose context ends during that wait returns the context's error
// (ErrMigrationLockTimeout once a wait outlasted the busy timeout).
func (s *Store) Migrate(ctx context.Context) error {
	if err := s.ready(ctx); err != nil {
		return err
	}
	if err := s.core.Migrate(ctx); err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	return nil
}

// CheckSchema reports whether the database holds the schema this version
// of millpond needs (every column its statements use). When a migration
// has not run it returns an error wrapping ErrSchemaOutdated that names the
// missing columns. Subscribe runs it once per store, so a new version
// started before its migrations fails at once with that error instead of
// failing every claim; call it at start where nothing subscribes.
func (s *Store) CheckSchema(ctx context.Context) error {
	if err := s.ready(ctx); err != nil {
		return err
	}
	if s.schemaOK.Load() {
		return nil
	}
	if err := s.core.CheckSchema(ctx); err != nil {
		return fmt.Errorf("outbox: check schema: %w", err)
	}
	s.schemaOK.Store(true)
	return nil
}

// MigrateDown removes the outbox schema and every event in it. Its lock
// waits are bounded and retried as Migrate's are.
func (s *Store) MigrateDown(ctx context.Context) error {
	if err := s.ready(ctx); err != nil {
		return err
	}
	s.schemaOK.Store(false)
	if err := s.core.MigrateDown(ctx); err != nil {
		return fmt.Errorf("outbox: migrate down: %w", err)
	}
	return nil
}

// Migrations returns the plain SQL migrations of a dialect ("postgres",
// "mysql", "sqlite"), in order, for teams whose release tooling owns the
// DDL; an unknown dialect returns ErrUnknownDialect. MigrationsFS and
// GooseMigrationsFS give the same steps as files that golang-migrate and
// goose read directly.
func Migrations(dialect string) ([]Migration, error) {
	ms, err := sqlcore.LoadMigrations(sqlcore.Dialect(dialect))
	if err != nil {
		return nil, fmt.Errorf("outbox: migrations: %w", err)
	}
	return convert(ms, migrationFromCore), nil
}

// Enqueue records ev inside the caller's open transaction tx (SQLTx or
// PgxTx); a nil transaction is refused with ErrNoTransaction. It is
// idempotent on (stream, key): the same
// kind and payload return the existing id with Inserted false; other content
// returns ErrIdempotencyConflict.
func (s *Store) Enqueue(ctx context.Context, tx Tx, ev Event) (Enqueued, error) {
	if err := s.ready(ctx); err != nil {
		return Enqueued{}, err
	}
	ex, err := tx.executor()
	if err != nil {
		return Enqueued{}, err
	}
	res, err := s.enqueue(ctx, ex, ev)
	if err != nil {
		return Enqueued{}, fmt.Errorf("outbox: enqueue: %w", err)
	}
	return res, nil
}

// enqueue records the event and wakes subscribers: by a PostgreSQL NOTIFY
// that commits with the transaction, when the gate lets one go; the
// subscribers of this process at once (they poll quickly until the
// transaction commits) unless that NOTIFY will reach them: it goes, the
// listener is up and the stream's last NOTIFY came back.
//
// The NOTIFY rides in the enqueue statement itself, so it costs no round
// trip; a duplicate enqueue sends none and leaves the next one due.
func (s *Store) enqueue(ctx context.Context, ex sqlcore.Executor, ev Event) (Enqueued, error) {
	ctx, span, md := s.tel.startSend(ctx, ev)
	ev.Metadata = md
	notify, heard := s.gate.due(ev.Stream)
	out, err := s.core.Enqueue(ctx, withPrepared(ex, s.stmts), sqlcore.Event(ev), notify)
	res := Enqueued(out)
	endSend(span, err)
	if err == nil && res.Inserted {
		s.tel.countEnqueued(ctx, ev.Stream, ev.Kind)
	}
	if notify && (err != nil || !res.Inserted) {
		// No NOTIFY was queued (a known event inserts nothing and announces
		// nothing): the next enqueue sends it.
		s.gate.forget(ev.Stream)
	}
	if err != nil || !res.Inserted {
		return res, err
	}
	if !notify || !heard || !s.listenerUp.Load() {
		// No NOTIFY of this transaction will reach this process's
		// subscribers, or it may not (the stream's last one did not come
		// back): they poll quickly until it has committed.
		s.wake.notifySoon(ev.Stream)
	}
	return res, nil
}

// Claim takes up to req.Limit due events, oldest first, under a lease.
func (s *Store) Claim(ctx context.Context, req ClaimRequest) ([]Claimed, error) {
	if err := s.ready(ctx); err != nil {
		return nil, err
	}
	out, err := s.core.Claim(ctx, sqlcore.ClaimRequest(req))
	if err != nil {
		return nil, fmt.Errorf("outbox: claim: %w", err)
	}
	return convert(out, claimedFromCore), nil
}

// Acknowledge marks one claimed event delivered. A stale claim returns
// ErrStaleClaim and changes nothing.
func (s *Store) Acknowledge(ctx context.Context, r Receipt) error {
	if err := s.ready(ctx); err != nil {
		return err
	}
	stale, err := s.AcknowledgeBatch(ctx, []Receipt{r})
	if err != nil {
		return err
	}
	if len(stale) > 0 {
		return fmt.Errorf("outbox: acknowledge event %d: %w", r.ID, ErrStaleClaim)
	}
	return nil
}

// AcknowledgeBatch marks delivered, in one statement, every receipt that
// still owns its event, and returns the stale ones (left unchanged).
func (s *Store) AcknowledgeBatch(ctx context.Context, rs []Receipt) ([]Receipt, error) {
	if err := s.ready(ctx); err != nil {
		return nil, err
	}
	stale, err := s.core.AcknowledgeBatch(ctx, convert(rs, receiptToCore))
	if err != nil {
		return nil, fmt.Errorf("outbox: acknowledge %d events: %w", len(rs), err)
	}
	return convert(stale, receiptFromCore), nil
}

// AcknowledgeAndClaimNext is AcknowledgeBatch for a consumer of events
// with ordering keys: when it settles the head of an ordering key of
// req.Stream and req.Group, and the key's next event is due and has
// attempts left, it claims that event for req.Worker under req.Lease (a
// fresh claim key, one more attempt), in the same transaction that makes it
// the key's head, instead of leaving it pending for a later Claim: one row
// write and one claim less per event. At most req.Limit events are handed
// over; the rest become pending as with AcknowledgeBatch. It returns the
// claimed events, content included, and the stale receipts.
//
// Each key still has at most one event claimed per group: the one handed
// over is the key's head, and its claim is an ordinary claim (Acknowledge,
// Fail, Extend and Release take its receipt; an expired lease delivers it
// again). Claims returned together with an error are the caller's too:
// release them or let their leases expire.
func (s *Store) AcknowledgeAndClaimNext(ctx context.Context, rs []Receipt, req ClaimRequest) ([]Claimed, []Receipt, error) {
	if err := s.ready(ctx); err != nil {
		return nil, nil, err
	}
	stale, next, err := s.core.AcknowledgeAndClaimNext(ctx, convert(rs, receiptToCore), sqlcore.ClaimRequest(req))
	claimed := convert(next, claimedFromCore)
	if err != nil {
		return claimed, nil, fmt.Errorf("outbox: acknowledge %d events: %w", len(rs), err)
	}
	return claimed, convert(stale, receiptFromCore), nil
}

// AcknowledgeInTx marks claimed events delivered inside the caller's open
// transaction tx (SQLTx or PgxTx), so a handler's own writes and the
// acknowledgement commit together or not at all: if tx rolls back, the
// events stay claimed and are retried after their leases. It returns
// ErrStaleClaim when a receipt no longer owns its event under a live lease.
//
// A Subscriber of this process that handed the events out learns of the
// acknowledgement: when the handler then acks the message it writes no
// acknowledgement of its own (and logs no lost lease), and it stops
// extending the events' leases (an extension would wait for the row the
// acknowledgement locked). When the handler nacks it (its transaction
// rolled back) the Nack is recorded as usual if the lease still runs; a
// transaction that outlived the lease leaves the event due again at once,
// its Nack (backoff, reason) not recorded. Keep such transactions shorter
// than the lease. Commit tx before acking the message.
func (s *Store) AcknowledgeInTx(ctx context.Context, tx Tx, rs ...Receipt) error {
	if err := s.ready(ctx); err != nil {
		return err
	}
	ex, err := tx.executor()
	if err != nil {
		return err
	}
	stale, err := s.core.AcknowledgeInTx(ctx, ex, convert(rs, receiptToCore))
	if err != nil {
		return fmt.Errorf("outbox: acknowledge %d events in a transaction: %w", len(rs), err)
	}
	noteAckedInTx(without(rs, convert(stale, receiptFromCore)))
	if len(stale) > 0 {
		return fmt.Errorf("outbox: acknowledge %d of %d events in a transaction: %w", len(stale), len(rs), ErrStaleClaim)
	}
	return nil
}

// Fail settles a claim as failed: pending again after f.RetryDelay, or
// dead-lettered at f.MaxAttempts. A stale claim returns ErrStaleClaim.
func (s *Store) Fail(ctx context.Context, r Receipt, f Failure) (FailOutcome, error) {
	if err := s.ready(ctx); err != nil {
		return FailOutcome{}, err
	}
	out, err := s.core.Fail(ctx, sqlcore.Receipt(r), sqlcore.Failure(f))
	if err != nil {
		return FailOutcome{}, fmt.Errorf("outbox: fail event %d: %w", r.ID, err)
	}
	return FailOutcome(out), nil
}

// Extend moves one claim's lease to now+lease and returns the new expiry. A
// stale claim returns ErrStaleClaim.
func (s *Store) Extend(ctx context.Context, r Receipt, lease time.Duration) (time.Time, error) {
	if err := s.ready(ctx); err != nil {
		return time.Time{}, err
	}
	expires, stale, err := s.ExtendBatch(ctx, []Receipt{r}, lease)
	if err != nil {
		return time.Time{}, err
	}
	if len(stale) > 0 {
		return time.Time{}, fmt.Errorf("outbox: extend event %d: %w", r.ID, ErrStaleClaim)
	}
	return expires, nil
}

// ExtendBatch moves the lease of every live claim to now+lease, in one
// statement, and returns the new expiry and the stale receipts.
func (s *Store) ExtendBatch(ctx context.Context, rs []Receipt, lease time.Duration) (time.Time, []Receipt, error) {
	if err := s.ready(ctx); err != nil {
		return time.Time{}, nil, err
	}
	expires, stale, err := s.core.ExtendBatch(ctx, convert(rs, receiptToCore), lease)
	if err != nil {
		return time.Time{}, nil, fmt.Errorf("outbox: extend %d events: %w", len(rs), err)
	}
	return expires, convert(stale, receiptFromCore), nil
}

// Release hands claimed but unstarted events back at once, without counting
// the attempt, and returns how many it released. Stale receipts (wrong key,
// expired lease) are skipped and change nothing.
func (s *Store) Release(ctx context.Context, rs ...Receipt) (int, error) {
	if err := s.ready(ctx); err != nil {
		return 0, err
	}
	n, err := s.core.Release(ctx, convert(rs, receiptToCore))
	if err != nil {
		return 0, fmt.Errorf("outbox: release %d events: %w", len(rs), err)
	}
	return n, nil
}

// ListDead lists dead-lettered events, oldest first.
func (s *Store) ListDead(ctx context.Context, q DeadQuery) ([]DeadEvent, error) {
	if err := s.ready(ctx); err != nil {
		return nil, err
	}
	out, err := s.core.ListDead(ctx, sqlcore.DeadQuery(q))
	if err != nil {
		return nil, fmt.Errorf("outbox: list dead letters: %w", err)
	}
	return convert(out, deadFromCore), nil
}

// Requeue makes dead-lettered events of a stream pending again, attempts
// reset, and returns how many it requeued.
func (s *Store) Requeue(ctx context.Context, stream string, ids ...int64) (int, error) {
	if err := s.ready(ctx); err != nil {
		return 0, err
	}
	n, err := s.core.Requeue(ctx, stream, ids)
	if err != nil {
		return 0, fmt.Errorf("outbox: requeue %d events: %w", len(ids), err)
	}
	return n, nil
}

// Reroute moves dead-lettered events of a stream's default group "" (events
// that no consumer group took when they were enqueued, which the bus
// dead-letters as unrouted) to the groups that take their kind now, as
// fresh pending deliveries; use it after adding the handler they were
// waiting for. Events that no group takes yet stay dead. It returns how many
// it moved.
func (s *Store) Reroute(ctx context.Context, stream string, ids ...int64) (int, error) {
	if err := s.ready(ctx); err != nil {
		return 0, err
	}
	n, err := s.core.Reroute(ctx, stream, ids)
	if err != nil {
		return 0, fmt.Errorf("outbox: reroute %d events: %w", len(ids), err)
	}
	return n, nil
}

// Purge deletes up to limit rows delivered more than olderThan ago and
// returns how many it deleted. A purged key may be enqueued again: the
// idempotency window is the retention horizon. With WithDeleteOnAck it
// also deletes, within the same limit and after those rows, events created
// more than olderThan ago that no delivery row points at (acknowledged or
// discarded ones), and counts them in the result.
func (s *Store) Purge(ctx context.Context, olderThan time.Duration, limit int) (int64, error) {
	if err := s.ready(ctx); err != nil {
		return 0, err
	}
	n, err := s.core.Purge(ctx, olderThan, limit)
	if err != nil {
		return 0, fmt.Errorf("outbox: purge: %w", err)
	}
	return n, nil
}

// CountPurgeable counts what Purge(ctx, olderThan, n) would delete now
// with no limit: rows delivered more than olderThan ago and, with
// WithDeleteOnAck, events created before the horizon that no delivery row
// points at once those rows are gone. It reads without locking; it is a snapshot for a confirmation
// or a dry run, as rows delivered meanwhile are purged too.
func (s *Store) CountPurgeable(ctx context.Context, olderThan time.Duration) (int64, error) {
	if err := s.ready(ctx); err != nil {
		return 0, err
	}
	n, err := s.core.CountPurgeable(ctx, olderThan)
	if err != nil {
		return 0, fmt.Errorf("outbox: count purgeable events: %w", err)
	}
	return n, nil
}

// Stats counts undelivered rows per stream and consumer group.
func (s *Store) Stats(ctx context.Context) ([]StreamStats, error) {
	if err := s.ready(ctx); err != nil {
		return nil, err
	}
	out, err := s.core.Stats(ctx)
	if err != nil {
		return nil, fmt.Errorf("outbox: stats: %w", err)
	}
	return convert(out, statsFromCore), nil
}

// RegisterGroup durably subscribes a consumer group to a stream, for the
// given event kinds or, with none, for all kinds; matching events enqueued
// from then on get a delivery row for the group. Idempotent.
func (s *Store) RegisterGroup(ctx context.Context, stream, group string, kinds ...string) error {
	if err := s.ready(ctx); err != nil {
		return err
	}
	if err := s.core.RegisterGroup(ctx, stream, group, kinds...); err != nil {
		return fmt.Errorf("outbox: register group: %w", err)
	}
	return nil
}

// SetGroupKinds makes a group's subscription to a stream exactly the given
// kinds (none: all kinds), in one transaction, dropping kinds it no longer
// lists. Idempotent.
func (s *Store) SetGroupKinds(ctx context.Context, stream, group string, kinds ...string) error {
	if err := s.ready(ctx); err != nil {
		return err
	}
	if err := s.core.SetGroupKinds(ctx, stream, group, kinds...); err != nil {
		return fmt.Errorf("outbox: set group kinds: %w", err)
	}
	return nil
}

// UnregisterGroup removes a group's subscription; its existing rows stay.
func (s *Store) UnregisterGroup(ctx context.Context, stream, group string) error {
	if err := s.ready(ctx); err != nil {
		return err
	}
	if err := s.core.UnregisterGroup(ctx, stream, group); err != nil {
		return fmt.Errorf("outbox: unregister group: %w", err)
	}
	return nil
}

// without returns the receipts of rs that are not in drop.
func without(rs, drop []Receipt) []Receipt {
	if len(drop) == 0 {
		return rs
	}
	skip := make(map[Receipt]bool, len(drop))
	for _, r := range drop {
		skip[r] = true
	}
	var out []Receipt
	for _, r := range rs {
		if !skip[r] {
			out = append(out, r)
		}
	}
	return out
}
