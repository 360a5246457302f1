package sqlcore

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Core runs the outbox statements of one dialect against one database.
type Core struct {
	dialect Dialect
	db      DB
	clock   func() time.Time
	stmts   *statements
	// onConflict sees every conflict (deadlock, serialization failure,
	// SQLite busy) that the core retries.
	onConflict func(what string, err error, wait time.Duration)
	// deleteOnAck: acknowledgements delete delivery rows (WithDeleteOnAck).
	deleteOnAck bool
	// migrationLockTimeout bounds each lock wait of a migration
	// (WithMigrationLockTimeout); 0 means DefaultMigrationLockTimeout.
	migrationLockTimeout time.Duration
}

// Option configures a Core.
type Option func(*Core)

// WithClock replaces the database clock, for tests that need a fixed time.
// Production code should leave the database clock in charge of leases.
func WithClock(now func() time.Time) Option {
	return func(c *Core) { c.clock = now }
}

// WithConflictObserver sets a function called for every statement or
// transaction that the database aborted to break a deadlock or a
// serialization conflict (or that SQLite's busy timeout ended) and that the
// core runs again after wait. what names the operation.
func WithConflictObserver(f func(what string, err error, wait time.Duration)) Option {
	return func(c *Core) { c.onConflict = f }
}

// WithDeleteOnAck makes every acknowledgement delete the delivery rows it
// settles instead of marking them delivered. Event rows stay, as the
// idempotency keys, until Purge deletes those older than its horizon that
// no delivery row points at; deleting delivery rows otherwise (discarding
// dead letters, retiring a group, rerouting) leaves their events to Purge
// too.
func WithDeleteOnAck() Option {
	return func(c *Core) { c.deleteOnAck = true }
}

// New returns a Core for the dialect over db.
func New(d Dialect, db DB, opts ...Option) (*Core, error) {
	if !d.Valid() {
		return nil, fmt.Errorf("sqlcore: unknown dialect %q", d)
	}
	if db == nil {
		return nil, errors.New("sqlcore: nil database")
	}
	c := &Core{dialect: d, db: db}
	for _, opt := range opts {
		opt(c)
	}
	c.stmts = buildStatements(d, c.deleteOnAck)
	return c, nil
}

// Dialect returns the core's dialect.
func (c *Core) Dialect() Dialect { return c.dialect }

// EnqueueStatements returns the texts of the fixed statements that Enqueue
// runs in the caller's transaction, those worth preparing once and reusing
// (the statements of a known key, and of ordering keys, included). Texts
// that Enqueue builds at run time are not among them.
func (c *Core) EnqueueStatements() []string {
	var out []string
	for _, q := range []query{c.stmts.insertEvent, c.stmts.enqueue, c.stmts.enqueueNotify, c.stmts.existing, c.stmts.existingLocked,
		c.stmts.enqueueOrdered, c.stmts.enqueueOrderedNotify, c.stmts.orderedGroups, c.stmts.bumpKey, c.stmts.keyState,
		c.stmts.insertOrdered, c.stmts.unbumpKey} {
		if q.text != "" {
			out = append(out, q.text)
		}
	}
	return out
}

// nowArg is the @now argument: the injected clock, or nil for the database clock.
func (c *Core) nowArg() any {
	if c.clock == nil {
		return nil
	}
	return c.clock().UnixMicro()
}

// resolveNow returns the current time in microseconds, read from the
// database unless a clock is injected.
func (c *Core) resolveNow(ctx context.Context, ex Executor) (int64, error) {
	if c.clock != nil {
		return c.clock().UnixMicro(), nil
	}
	var now int64
	err := c.queryRow(ctx, ex, c.stmts.now, map[string]any{"now": nil}, &now)
	if errors.Is(err, errNoRow) {
		return 0, errors.New("database returned no time")
	}
	return now, err
}

func micros(d time.Duration) int64 { return d.Microseconds() }

func fromMicros(us int64) time.Time {
	if us == 0 {
		return time.Time{}
	}
	return time.UnixMicro(us).UTC()
}

// contentHash identifies an event's content for idempotency: the SHA-256
// of kind and payload, and of the ordering key when there is one (so that
// the same key enqueued again with another ordering key is a conflict).
// Neither kinds nor ordering keys contain bytes 0 or 1, so the two forms
// cannot collide.
func contentHash(kind string, payload []byte, orderingKey string) []byte {
	h := sha256.New()
	if orderingKey != "" {
		h.Write([]byte(orderingKey))
		h.Write([]byte{1})
	}
	h.Write([]byte(kind))
	h.Write([]byte{0})
	h.Write(payload)
	return h.Sum(nil)
}

func encodeMetadata(md map[string]string) (string, error) {
	if len(md) == 0 {
		return "{}", nil
	}
	b, err := json.Marshal(md)
	if err != nil {
		return "", fmt.Errorf("encode metadata: %w", err)
	}
	if len(b) > MaxMetadataBytes {
		return "", fmt.Errorf("metadata is %d bytes, more than %d: %w", len(b), MaxMetadataBytes, ErrInvalidMetadata)
	}
	return string(b), nil
}

// decodeMetadata decodes a metadata column: a JSON object of strings, as
// encodeMetadata wrote it. Every claimed event's metadata is decoded, so an
// object whose strings hold no escape is read directly, its keys and
// values substrings of text (encoding/json allocated about nine objects
// for one entry, this two); anything else goes to encoding/json, and the
// result is the same either way (FuzzDecodeMetadata).
func decodeMetadata(text string) (map[string]string, error) {
	if text == "" || text == "{}" {
		return map[string]string{}, nil
	}
	if md, ok := decodePlainObject(text); ok {
		return md, nil
	}
	md := map[string]string{}
	if err := json.Unmarshal([]byte(text), &md); err != nil {
		return nil, fmt.Errorf("decode metadata: %w", err)
	}
	return md, nil
}

// decodePlainObject reads a JSON object of strings that hold no escape,
// control character or invalid UTF-8 (for these encoding/json's reading
// differs from the text: json.Marshal writes quotes, backslashes, control
// characters, '<', '>', '&', U+2028, U+2029 and invalid UTF-8 as escapes,
// so what it wrote without one needs no decoding). False: text is not such
// an object, and encoding/json must read it.
func decodePlainObject(text string) (map[string]string, bool) {
	if strings.IndexByte(text, '\\') >= 0 {
		return nil, false
	}
	i := skipJSONSpace(text, 0)
	if i >= len(text) || text[i] != '{' {
		return nil, false
	}
	md := make(map[string]string, strings.Count(text, `"`)/4)
	i = skipJSONSpace(text, i+1)
	if i < len(text) && text[i] == '}' {
		return md, skipJSONSpace(text, i+1) == len(text)
	}
	for {
		k, next, ok := plainJSONString(text, i)
		if !ok {
			return nil, false
		}
		i = skipJSONSpace(text, next)
		if i >= len(text) || text[i] != ':' {
			return nil, false
		}
		v, next, ok := plainJSONString(text, skipJSONSpace(text, i+1))
		if !ok {
			return nil, false
		}
		md[k] = v
		i = skipJSONSpace(text, next)
		if i >= len(text) {
			return nil, false
		}
		switch text[i] {
		case ',':
			i = skipJSONSpace(text, i+1)
		case '}':
			return md, skipJSONSpace(text, i+1) == len(text)
		default:
			return nil, false
		}
	}
}

// plainJSONString reads the JSON string at text[i] (a quote) that holds no
// escape, control character or invalid UTF-8, and returns it with the
// index after its closing quote.
func plainJSONString(text string, i int) (string, int, bool) {
	if i >= len(text) || text[i] != '"' {
		return "", i, false
	}
	end := strings.IndexByte(text[i+1:], '"')
	if end < 0 {
		return "", i, false
	}
	s := text[i+1 : i+1+end]
	for k := 0; k < len(s); k++ {
		if s[k] < 0x20 {
			return "", i, false
		}
	}
	if !utf8.ValidString(s) {
		return "", i, false
	}
	return s, i + end + 2, true
}

// skipJSONSpace returns the index of the first byte at or after i that is
// not JSON whitespace.
func skipJSONSpace(text string, i int) int {
	for i < len(text) && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r') {
		i++
	}
	return i
}

// Enqueue records ev inside the caller's open transaction tx: one row for
// every consumer group registered for the stream, or one row for the default
// group when none is. It is idempotent on (stream, key): the same kind and
// payload return the existing id with Inserted false; other content returns
// ErrIdempotencyConflict. The common case is one round trip.
//
// With notify set, on PostgreSQL, the same statement also queues a NOTIFY on
// NotifyChannel for the stream, sent when tx commits; other dialects ignore
// it. A notifying transaction takes a database-wide lock while it commits
// (PostgreSQL serialises the commits of notifying transactions), so callers
// should notify only a few times a second per stream, not on every enqueue.
func (c *Core) Enqueue(ctx context.Context, tx Executor, ev Event, notify bool) (_ Enqueued, err error) {
	if c.dialect == MySQL {
		// MySQL quotes a metadata value its connection's character set
		// cannot hold (error 1366): hide it.
		defer func() { err = hideQuotedValues(err) }()
	}
	if tx == nil {
		return Enqueued{}, errors.New("nil transaction")
	}
	if err := ev.Validate(); err != nil {
		return Enqueued{}, err
	}
	md, err := encodeMetadata(ev.Metadata)
	if err != nil {
		return Enqueued{}, err
	}
	payload := ev.Payload
	if payload == nil {
		payload = []byte{}
	}
	hash := contentHash(ev.Kind, payload, ev.OrderingKey)
	if ev.OrderingKey != "" {
		return c.enqueueOrdered(ctx, tx, ev, payload, md, hash, notify)
	}
	stmt := c.stmts.enqueue
	if notify && c.dialect == Postgres {
		stmt = c.stmts.enqueueNotify
	}
	vals := map[string]any{
		"stream": ev.Stream, "key": ev.Key, "kind": ev.Kind, "payload": payload,
		"metadata": md, "hash": hash, "now": c.nowArg(), "delay": micros(ev.Delay),
	}
	var args []any
	var id int64
	if c.dialect == Postgres {
		args = stmt.args(vals)
	} else {
		// The event's content first (nothing when it is known), then its
		// delivery rows. (The event's INSERT reads no other row, so on
		// MySQL it takes no share locks that concurrent enqueues could
		// deadlock on; a known key goes to the locking read of existing.)
		eid, err := c.insertEvent(ctx, tx, vals)
		if err != nil || eid == 0 {
			if err != nil {
				return Enqueued{}, err
			}
			return c.existing(ctx, tx, ev, hash)
		}
		vals["eid"] = eid
		args = stmt.args(vals)
	}
	switch c.dialect {
	case MySQL:
		res, err := tx.ExecContext(ctx, stmt.text, args...)
		if err != nil {
			return Enqueued{}, err
		}
		// The first row's id; without one the event's rows are looked up.
		if n, _ := res.RowsAffected(); n > 0 {
			id, err := insertedID(ctx, c.dialect, tx, res)
			if err != nil {
				return Enqueued{}, err
			}
			if id > 0 {
				return Enqueued{ID: id, Inserted: true}, nil
			}
		}
	case SQLite:
		// The rows take consecutive ids: the first is the last rowid
		// minus the rows inserted, plus one (see the statement).
		res, err := tx.ExecContext(ctx, stmt.text, args...)
		if err != nil {
			return Enqueued{}, err
		}
		if n, err := res.RowsAffected(); err == nil && n > 0 {
			last, err := insertedID(ctx, c.dialect, tx, res)
			if err != nil {
				return Enqueued{}, err
			}
			return Enqueued{ID: last - n + 1, Inserted: true}, nil
		}
	default:
		rows, err := tx.QueryContext(ctx, stmt.text, args...)
		if err != nil {
			return Enqueued{}, err
		}
		for rows.Next() {
			var rowID int64
			if err := rows.Scan(&rowID); err != nil {
				rows.Close()
				return Enqueued{}, err
			}
			if id == 0 || rowID < id {
				id = rowID
			}
		}
		if err := rowsErr(rows); err != nil {
			rows.Close()
			return Enqueued{}, err
		}
		if err := rows.Close(); err != nil {
			return Enqueued{}, err
		}
		if id > 0 {
			return Enqueued{ID: id, Inserted: true}, nil
		}
	}
	return c.existing(ctx, tx, ev, hash)
}

// insertEvent (MySQL, SQLite) inserts the content of an event and returns
// its id, or 0 when the stream already holds an event with its key.
func (c *Core) insertEvent(ctx context.Context, tx Executor, vals map[string]any) (int64, error) {
	return c.insertID(ctx, tx, c.stmts.insertEvent, vals)
}

// insertID runs an insert that does nothing on a conflict and returns the
// new row's id, or 0 when nothing was inserted: the insert's RETURNING id
// (PostgreSQL), MySQL's last insert id or SQLite's last rowid.
func (c *Core) insertID(ctx context.Context, tx Executor, q query, vals map[string]any) (int64, error) {
	if c.dialect != Postgres {
		res, err := tx.ExecContext(ctx, q.text, q.args(vals)...)
		if err != nil {
			return 0, err
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			return 0, err
		}
		return insertedID(ctx, c.dialect, tx, res)
	}
	var id int64
	err := c.queryRow(ctx, tx, q, vals, &id)
	if errors.Is(err, errNoRow) {
		return 0, nil
	}
	return id, err
}

// existing resolves an enqueue that hit its idempotency key.
func (c *Core) existing(ctx context.Context, tx Executor, ev Event, hash []byte) (Enqueued, error) {
	// On MySQL a plain read first: in REPEATABLE READ the locking read
	// (existingLocked) share-locks the gap after the event's delivery rows
	// in their (event_id, consumer_group) index, for the newest events the
	// gap every new delivery row goes to, so a concurrent producer's insert
	// waited for this transaction to end while holding its key row or the
	// table's AUTO-INC lock, and this transaction's next enqueue deadlocked
	// with it. The event's row is already locked (the insert that found it
	// took its lock), and when the transaction's snapshot sees the event it
	// sees the delivery rows inserted with it. Only an event committed
	// after the snapshot was taken (a concurrent enqueue of the same key)
	// needs the locking read, which reads the latest rows.
	res, found, err := c.lookup(ctx, tx, c.stmts.existing, ev, hash)
	if err == nil && !found && c.dialect == MySQL {
		res, found, err = c.lookup(ctx, tx, c.stmts.existingLocked, ev, hash)
	}
	if err == nil && !found {
		err = errors.New("event was neither inserted nor found")
	}
	// An event whose delivery rows are all gone (acknowledged under
	// deleteOnAck, or discarded) is still known until Purge: ID 0.
	return res, err
}

// lookup runs q, which selects the id (0 when the event has no delivery
// row) and content hash of the event, and compares the content. No event
// gives a zero Enqueued and found false.
func (c *Core) lookup(ctx context.Context, tx Executor, q query, ev Event, hash []byte) (_ Enqueued, found bool, _ error) {
	rows, err := tx.QueryContext(ctx, q.text, q.args(map[string]any{"stream": ev.Stream, "key": ev.Key})...)
	if err != nil {
		return Enqueued{}, false, err
	}
	defer rows.Close()
	if !rows.Next() {
		return Enqueued{}, false, rowsErr(rows)
	}
	var id int64
	var stored []byte
	if err := rows.Scan(&id, &stored); err != nil {
		return Enqueued{}, true, err
	}
	if !bytes.Equal(stored, hash) {
		return Enqueued{}, true, ErrIdempotencyConflict // the caller names the operation
	}
	return Enqueued{ID: id, Inserted: false}, true, nil
}

// newClaimKey returns 128 random bits in lowercase hex.
func newClaimKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b[:])
}

// derivedClaimKey is the claim key of row id in a MySQL or PostgreSQL claim
// whose secret (newClaimKey, 128 random bits, never stored) is secret: the
// first 32 hex digits of SHA-256(secret || decimal id), which the claim's
// UPDATE computes in the database (MySQL: LEFT(SHA2(CONCAT(secret, id),
// 256), 32); PostgreSQL: left(encode(sha256(...), 'hex'), 32)). One
// argument for the whole batch instead of a CASE of one branch per row,
// which MariaDB evaluates row by row (a claim of 1,000 spent 30-60 ms in
// it), or of a random UUID per row, which cost PostgreSQL 5-10 µs a row.
// Without the secret, a row's key cannot be told from another's, nor
// guessed.
func derivedClaimKey(secret string, id int64) string {
	sum := sha256.Sum256([]byte(secret + strconv.FormatInt(id, 10)))
	return hex.EncodeToString(sum[:16])
}

// claimKeyBytes returns the random bytes of a PostgreSQL claim's keys: 16
// (128 bits) for each of the n rows it may take; the claim hands each row
// its own 16, in hex.
func claimKeyBytes(n int) []byte {
	b := make([]byte, 16*n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on supported platforms
	return b
}

// byID orders claimed rows by id.
func byID(a, b Claimed) int { return cmp.Compare(a.ID, b.ID) }

// Claim takes up to req.Limit due events (pending and available, or
// processing with an expired lease), oldest first, under a new lease with a
// fresh claim key each. Due events whose attempts are used up are
// dead-lettered instead of returned.
func (c *Core) Claim(ctx context.Context, req ClaimRequest) ([]Claimed, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	if c.dialect == MySQL {
		return c.claimMySQL(ctx, req)
	}
	var expired map[int64]bool
	if c.dialect == SQLite {
		// SQLite has one writer: an UPDATE that finds nothing still takes
		// the write lock, so idle polls would queue behind (and ahead of)
		// the application's transactions. Look first with a read.
		due, err := c.queryIDs(ctx, c.db, c.stmts.anyDue.text, c.stmts.anyDue.args(map[string]any{
			"stream": req.Stream, "group": req.Group, "now": c.nowArg(), "limit": req.Limit, "after": req.After,
		}))
		if err != nil || len(due) == 0 {
			return nil, err
		}
		expired = due // ids of due rows whose lease expired (and 0)
	}
	q := c.stmts.claim
	vals := map[string]any{
		"stream": req.Stream, "group": req.Group, "worker": req.Worker, "limit": req.Limit,
		"max": req.MaxAttempts, "lease": micros(req.Lease), "now": c.nowArg(),
		"hold": req.DeadLetterPolicy == DeadLetterHold, "after": req.After,
	}
	if c.dialect == Postgres {
		vals["key_bytes"] = claimKeyBytes(req.Limit)
	}
	rows, err := c.db.QueryContext(ctx, q.text, q.args(vals)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make([]Claimed, 0, req.Limit)
	var eventIDs []int64 // SQLite: the event of each row of out
	// The scan's destinations are made once, not per row (where they
	// escaped to the heap: five allocations a row). The claim does not
	// return the stream and group: they are the request's.
	var cl Claimed
	var md, status string
	var expires, created, eid int64
	dest := []any{&cl.ID, &cl.Key, &cl.Kind, &cl.Payload, &md, &cl.Attempts, &cl.ClaimKey, &expires, &created, &cl.OrderingKey, &cl.OrderingSeq, &cl.Reclaimed}
	if c.dialect == SQLite {
		dest = []any{&cl.ID, &eid, &cl.Attempts, &cl.ClaimKey, &expires, &cl.OrderingKey, &cl.OrderingSeq, &status}
	}
	for rows.Next() {
		cl = Claimed{}
		if c.dialect == SQLite {
			if err := rows.Scan(dest...); err != nil {
				return nil, err
			}
			if status != StatusProcessing {
				continue
			}
			cl.Stream, cl.Group = req.Stream, req.Group
			cl.LeaseExpiresAt = fromMicros(expires)
			cl.Reclaimed = expired[cl.ID]
			out = append(out, cl)
			eventIDs = append(eventIDs, eid)
			continue
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		cl.Stream, cl.Group = req.Stream, req.Group
		if cl.Metadata, err = decodeMetadata(md); err != nil {
			return nil, err
		}
		cl.LeaseExpiresAt, cl.CreatedAt = fromMicros(expires), fromMicros(created)
		out = append(out, cl)
	}
	if err := rowsErr(rows); err != nil {
		return nil, err
	}
	if err := rows.Close(); err != nil {
		return nil, err
	}
	if c.dialect == SQLite {
		if out, err = c.withContent(ctx, c.db, out, eventIDs); err != nil {
			return nil, err
		}
	}
	// Oldest first: PostgreSQL returns the rows in the order its UPDATE
	// found them, SQLite in any order.
	if !slices.IsSortedFunc(out, byID) {
		slices.SortFunc(out, byID)
	}
	return c.settleExhausted(ctx, req, out), nil
}

// withContent fills claimed rows with their events' content (eventIDs[i] is
// the event of out[i]). A row whose event is gone (a group retirement
// deleted it since) is left out.
func (c *Core) withContent(ctx context.Context, ex Executor, out []Claimed, eventIDs []int64) ([]Claimed, error) {
	events, err := c.eventsByID(ctx, ex, slices.Compact(slices.Sorted(slices.Values(eventIDs))))
	if err != nil {
		return nil, err
	}
	kept := out[:0]
	for i, cl := range out {
		ev, ok := events[eventIDs[i]]
		if !ok {
			continue
		}
		cl.Key, cl.Kind, cl.Payload, cl.CreatedAt = ev.key, ev.kind, ev.payload, fromMicros(ev.created)
		if cl.Metadata, err = decodeMetadata(ev.metadata); err != nil {
			return nil, err
		}
		kept = append(kept, cl)
	}
	return kept, nil
}

// claimMySQL finds due rows with a plain read, then locks them with SKIP
// LOCKED and claims or dead-letters them, in one transaction.
//
// The read runs before the transaction, on the pool: under READ COMMITTED
// it would see no more inside it, and the locking read checks each row's
// state again. A poll that finds nothing due is then one statement, not a
// transaction of four round trips (its isolation level, BEGIN, the read,
// COMMIT).
func (c *Core) claimMySQL(ctx context.Context, req ClaimRequest) ([]Claimed, error) {
	vals := map[string]any{"stream": req.Stream, "group": req.Group, "limit": req.Limit, "now": c.nowArg(), "after": req.After}
	due, err := c.queryIDs(ctx, c.db, c.stmts.claimDue.text, c.stmts.claimDue.args(vals))
	if err != nil || len(due) == 0 {
		return nil, err
	}
	var out []Claimed
	err = c.inTxRetry(ctx, "claim", &sql.TxOptions{Isolation: sql.LevelReadCommitted}, func(tx Tx) error {
		var eventIDs, dead []int64
		var now int64
		var err error
		if out, eventIDs, dead, now, err = c.lockDueMySQL(ctx, tx, req, due); err != nil {
			return err
		}
		if len(dead) > 0 {
			if err := c.deadLetterExhaustedMySQL(ctx, tx, req, dead); err != nil {
				return err
			}
		}
		if len(out) == 0 {
			return nil
		}
		if out, err = c.withContent(ctx, tx, out, eventIDs); err != nil {
			return err
		}
		expires := now + micros(req.Lease)
		ids := make([]int64, len(out))
		secret := newClaimKey()
		for i := range out {
			out[i].ClaimKey = derivedClaimKey(secret, out[i].ID)
			out[i].Attempts++
			out[i].LeaseExpiresAt = fromMicros(expires)
			ids[i] = out[i].ID
		}
		text, idArgs := expandIDs(c.stmts.claimUpdate, ids)
		_, err = tx.ExecContext(ctx, text, append([]any{req.Worker, expires, secret}, idArgs...)...)
		return err
	})
	if err != nil {
		return nil, err
	}
	return c.settleExhausted(ctx, req, out), nil
}

// maxDuePages is the most pages of due rows a MySQL claim reads (see
// lockDueMySQL).
const maxDuePages = 8

// lockDueMySQL locks up to req.Limit due rows that no other transaction
// holds (SKIP LOCKED), in id order, starting with the ids of due (found by
// claimDue), and returns them with their events' ids (for withContent),
// the ids of those whose attempts are used up (to dead-letter: not in
// out) and the database clock of the locking read.
//
// Rows held by other transactions are still due to the plain read that
// found them: the rows of held claims (ClaimHeld) stay pending while they
// are held. When a full page of due rows yields fewer than req.Limit rows
// the claim reads the next page, after the page's last id, up to
// maxDuePages pages: claims read on past the held rows instead of coming
// back empty behind them.
func (c *Core) lockDueMySQL(ctx context.Context, tx Tx, req ClaimRequest, due map[int64]bool) (out []Claimed, eventIDs, dead []int64, now int64, err error) {
	page := slices.Sorted(maps.Keys(due))
	for n := 1; ; n++ {
		q := c.stmts.claimSelect
		text, extra := expandIDs(strings.Replace(q.text, "{limit}", strconv.Itoa(req.Limit-len(out)-len(dead)), 1), page)
		rows, err := tx.QueryContext(ctx, text, append(q.args(map[string]any{"now": c.nowArg()}), extra...)...)
		if err != nil {
			return nil, nil, nil, 0, err
		}
		// The scan's targets are declared once (each would escape to the
		// heap, every row); the due ids are rows of the request's stream
		// and group, which are not read back.
		var (
			cl               Claimed
			status           sql.RawBytes
			eid, availableAt int64
		)
		dest := []any{&cl.ID, &eid, &cl.Attempts, &cl.ClaimKey, &availableAt, &cl.OrderingKey, &cl.OrderingSeq, &status, &now}
		for rows.Next() {
			cl = Claimed{}
			if err := rows.Scan(dest...); err != nil {
				rows.Close()
				return nil, nil, nil, 0, err
			}
			cl.Stream, cl.Group = req.Stream, req.Group
			// Under DeadLetterSkip an exhausted row with an ordering key is
			// claimed once more and settled by settleExhausted (see deadAt).
			if cl.Attempts >= req.MaxAttempts && (req.DeadLetterPolicy == DeadLetterHold || cl.OrderingKey == "") {
				dead = append(dead, cl.ID)
				continue
			}
			cl.Reclaimed = string(status) == StatusProcessing
			out = append(out, cl)
			eventIDs = append(eventIDs, eid)
		}
		if err := rowsErr(rows); err != nil {
			rows.Close()
			return nil, nil, nil, 0, err
		}
		if err := rows.Close(); err != nil {
			return nil, nil, nil, 0, err
		}
		if len(out)+len(dead) >= req.Limit || len(page) < req.Limit || n == maxDuePages {
			return out, eventIDs, dead, now, nil
		}
		next := map[string]any{"stream": req.Stream, "group": req.Group, "limit": req.Limit, "now": c.nowArg(), "after": page[len(page)-1]}
		more, err := c.queryIDs(ctx, tx, c.stmts.claimDue.text, c.stmts.claimDue.args(next))
		if err != nil || len(more) == 0 {
			return out, eventIDs, dead, now, err
		}
		page = slices.Sorted(maps.Keys(more))
	}
}

// deadLetterExhaustedMySQL dead-letters the rows a claim locked whose
// attempts are used up.
func (c *Core) deadLetterExhaustedMySQL(ctx context.Context, tx Tx, req ClaimRequest, dead []int64) error {
	text, extra := expandIDs(c.stmts.claimDead.text, dead)
	_, err := tx.ExecContext(ctx, text, append(c.stmts.claimDead.args(map[string]any{"worker": req.Worker}), extra...)...)
	return err
}

// AcknowledgeBatch marks delivered every receipt whose claim key still owns
// its event under a live lease, in one statement, and returns the receipts
// that were stale (nothing changed for those).
func (c *Core) AcknowledgeBatch(ctx context.Context, rs []Receipt) (stale []Receipt, err error) {
	stale, _, err = c.acknowledge(ctx, rs, nil)
	return stale, err
}

// AcknowledgeAndClaimNext is AcknowledgeBatch that also hands the next
// events over: when it settles the head of an ordering key of req.Stream
// and req.Group whose next event is due and has attempts left, it claims
// that event for req.Worker under req.Lease (a fresh claim key, one more
// attempt), in the transaction that makes it the key's head, instead of
// making it pending for a later Claim; at most req.Limit of them. It
// returns them, content included, with the stale receipts; claims it
// returns with an error are the caller's too (the acknowledgement of some
// receipts committed, and handed them over, before the error). The next events
// of other keys (not due, other groups, beyond the limit) become pending as
// with AcknowledgeBatch.
func (c *Core) AcknowledgeAndClaimNext(ctx context.Context, rs []Receipt, req ClaimRequest) ([]Receipt, []Claimed, error) {
	if err := req.Validate(); err != nil {
		return nil, nil, err
	}
	return c.acknowledge(ctx, rs, &req)
}

// acknowledge is AcknowledgeBatch, handing next events over for hand when
// it is not nil.
func (c *Core) acknowledge(ctx context.Context, rs []Receipt, hand *ClaimRequest) (stale []Receipt, next []Claimed, err error) {
	if err := validateReceipts(rs); err != nil {
		return nil, nil, err
	}
	rs = sortedReceipts(rs)
	var settled map[int64]bool
	if c.dialect == MySQL && hand == nil {
		all, err := c.ackAllMySQL(ctx, rs)
		if err != nil {
			return nil, nil, err
		}
		if all {
			return nil, nil, nil
		}
	}
	if c.dialect == MySQL {
		// What the transaction handed over is the caller's only once it
		// committed: a commit that failed (a killed connection) left those
		// events claimable, and a claim would deliver them a second time.
		var handed []Claimed
		err = c.inTxRetry(ctx, "acknowledge", &sql.TxOptions{Isolation: sql.LevelReadCommitted}, func(tx Tx) error {
			var err error
			settled, handed, err = c.ackMySQL(ctx, tx, rs, hand)
			return err
		})
		if err == nil {
			next = handed
		}
	} else {
		// Events without an ordering key are acknowledged in one statement,
		// as before ordering keys existed. On PostgreSQL that statement
		// also settles events with one, counts them off their keys and
		// promotes each key's next event, unless a producer of the key
		// committed while it waited for the key's row; those (and stale
		// receipts, which change nothing) are settled in a transaction
		// whose promotion is a later statement, on SQLite all of them.
		err = c.retryConflicts(ctx, "acknowledge", func() error {
			var err error
			if hand != nil && c.dialect == Postgres {
				settled, next, err = c.ackNext(ctx, c.db, rs, hand)
				return err
			}
			settled, err = c.ack(ctx, c.db, rs)
			return err
		})
		if rest := staleOf(rs, settled); err == nil && len(rest) > 0 {
			var more []Claimed
			err = c.inTxRetry(ctx, "acknowledge ordered events", &sql.TxOptions{Isolation: sql.LevelReadCommitted}, func(tx Tx) error {
				done, handed, err := c.ackOrderedRows(ctx, tx, rest, hand)
				if err != nil {
					return err
				}
				for id := range done {
					settled[id] = true
				}
				more = handed
				return nil
			})
			if err == nil && hand != nil && len(more) > 0 {
				// What the first statement handed over was committed and
				// is kept whatever this transaction did; what this one
				// handed over only if it committed.
				next = append(next, more...)
			}
		}
	}
	if err != nil {
		// The first statement may have committed and handed events over
		// before the rest failed: those claims are the caller's.
		return nil, next, err
	}
	return staleOf(rs, settled), next, nil
}

// sortedReceipts returns the receipts in id order, so that statements over
// several rows lock them in the same order everywhere.
func sortedReceipts(rs []Receipt) []Receipt {
	if slices.IsSortedFunc(rs, func(a, b Receipt) int { return cmp.Compare(a.ID, b.ID) }) {
		return rs
	}
	out := slices.Clone(rs)
	slices.SortFunc(out, func(a, b Receipt) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// AcknowledgeInTx is AcknowledgeBatch inside the caller's open transaction
// ex, so that a handler's own writes and the acknowledgement of the event
// commit together or not at all. Nothing is settled until ex commits.
func (c *Core) AcknowledgeInTx(ctx context.Context, ex Executor, rs []Receipt) ([]Receipt, error) {
	if ex == nil {
		return nil, errors.New("nil transaction")
	}
	if err := validateReceipts(rs); err != nil {
		return nil, err
	}
	rs = sortedReceipts(rs)
	ctx = inCallerTx(ctx)
	settled, err := c.ack(ctx, ex, rs)
	if err != nil {
		return nil, err
	}
	if rest := staleOf(rs, settled); len(rest) > 0 && c.dialect != MySQL {
		done, _, err := c.ackOrderedRows(ctx, ex, rest, nil)
		if err != nil {
			return nil, err
		}
		for id := range done {
			settled[id] = true
		}
	}
	return staleOf(rs, settled), nil
}

func staleOf(rs []Receipt, settled map[int64]bool) []Receipt {
	var stale []Receipt
	for _, r := range rs {
		if !settled[r.ID] {
			stale = append(stale, r)
		}
	}
	return stale
}

// ack marks delivered (deleteOnAck: deletes) the rows of the receipts that
// still own their events under a live lease and returns their ids. On
// MySQL ex must be a transaction: it locks the rows the receipts still own, then marks exactly those (MySQL
// has no RETURNING, and telling afterwards which rows one UPDATE changed is
// ambiguous: a row acknowledged earlier at the same instant looks the same).
func (c *Core) ack(ctx context.Context, ex Executor, rs []Receipt) (map[int64]bool, error) {
	rs = inIDOrder(rs)
	switch c.dialect {
	case Postgres:
		ids, keys := splitReceipts(rs)
		return c.queryIDs(ctx, ex, c.stmts.ack.text, c.stmts.ack.args(map[string]any{"ids": ids, "keys": keys, "now": c.nowArg()}))
	case SQLite:
		text, extra := expandPairs(c.dialect, c.stmts.ack.text, rs)
		return c.queryIDs(ctx, ex, text, append(c.stmts.ack.args(map[string]any{"now": c.nowArg()}), extra...))
	}
	live, _, err := c.ackMySQL(ctx, ex, rs, nil)
	return live, err
}

// ackMySQL is ack on MySQL (rs in id order), handing the next events of
// the keys it settles over for hand when it is not nil.
func (c *Core) ackMySQL(ctx context.Context, ex Executor, rs []Receipt, hand *ClaimRequest) (map[int64]bool, []Claimed, error) {
	text, extra := expandPairs(c.dialect, c.stmts.ack.text, rs)
	rows, err := ex.QueryContext(ctx, text, append(c.stmts.ack.args(map[string]any{"now": c.nowArg()}), extra...)...)
	if err != nil {
		return nil, nil, err
	}
	live, keys, err := scanSettledRows(rows)
	if err != nil || len(live) == 0 {
		return live, nil, err
	}
	ids := slices.Sorted(maps.Keys(live))
	text, args := c.withIDs(c.stmts.ackMark, map[string]any{"now": c.nowArg()}, ids)
	if _, err = ex.ExecContext(ctx, text, args...); err != nil {
		return nil, nil, err
	}
	next, err := c.releaseKeysNext(ctx, ex, keys, hand)
	return live, next, err
}

// errNotAll ends ackAllMySQL's transaction when its UPDATE did not settle
// every receipt.
var errNotAll = errors.New("not every receipt was settled")

// ackAllMySQL is the first try of an acknowledgement on MySQL (rs in id
// order, in a transaction of its own): one UPDATE settles the receipts'
// rows, in id order, when they are processing under a live lease held by
// the receipt and have no ordering key. When it changed as many rows as
// there are receipts, every receipt was settled and the transaction
// commits: true. Otherwise (a stale receipt, a row with an ordering key,
// a receipt named twice) it rolls back, which releases the rows it locked,
// and the caller settles the receipts the usual way, a locking read
// first: false. Rolling back keeps every transaction locking its rows in
// one pass in id order (see inIDOrder); keeping the rows it changed and
// locking the others in a second pass would not. Rows that match are
// always changed (their status changes), so the count is the same
// whether the connection reports changed or matched rows.
func (c *Core) ackAllMySQL(ctx context.Context, rs []Receipt) (bool, error) {
	q := c.stmts.ackAll
	rs = inIDOrder(rs)
	ids := make([]int64, len(rs))
	for i, r := range rs {
		ids[i] = r.ID
	}
	text, extra := expandReceipts(q.text, rs)
	args := append(q.args(map[string]any{"now": c.nowArg(), "ids": jsonIDs(ids)}), extra...)
	err := c.inTxRetry(ctx, "acknowledge", &sql.TxOptions{Isolation: sql.LevelReadCommitted}, func(tx Tx) error {
		res, err := tx.ExecContext(ctx, text, args...)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n != int64(len(rs)) {
			return errNotAll
		}
		return nil
	})
	if errors.Is(err, errNotAll) {
		return false, nil
	}
	return err == nil, err
}

// inIDOrder returns the receipts sorted by event id (a copy; rs is left as
// it is). Every statement that locks several outbox rows takes its locks in
// id order, so that two of them over overlapping rows (the acknowledger and
// the lease extender of one Subscriber, say) cannot deadlock: MySQL and
// SQLite get their lists in this order, and PostgreSQL locks in a
// subselect ordered by id (its join with the array would otherwise lock in
// whatever order the plan reads the rows).
func inIDOrder(rs []Receipt) []Receipt {
	out := slices.Clone(rs)
	slices.SortStableFunc(out, func(a, b Receipt) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

func splitReceipts(rs []Receipt) ([]int64, []string) {
	ids := make([]int64, len(rs))
	keys := make([]string, len(rs))
	for i, r := range rs {
		ids[i], keys[i] = r.ID, r.ClaimKey
	}
	return ids, keys
}

// queryIDs runs a statement returning ids in its first column.
func (c *Core) queryIDs(ctx context.Context, ex Executor, text string, args []any) (map[int64]bool, error) {
	rows, err := ex.QueryContext(ctx, text, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	ids := map[int64]bool{}
	var id int64
	dest := []any{&id} // declared once: it would escape to the heap, every row
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		ids[id] = true
	}
	if err := rowsErr(rows); err != nil {
		return nil, err
	}
	return ids, rows.Close()
}

// Fail settles one claim as failed: the event becomes pending again after
// f.RetryDelay, or dead-lettered when its attempts reached f.MaxAttempts.
// A stale claim returns ErrStaleClaim and changes nothing.
func (c *Core) Fail(ctx context.Context, r Receipt, f Failure) (FailOutcome, error) {
	if err := ValidateReceipt(r); err != nil {
		return FailOutcome{}, err
	}
	if err := f.Validate(); err != nil {
		return FailOutcome{}, err
	}
	vals := map[string]any{"id": r.ID, "key": r.ClaimKey, "max": f.MaxAttempts, "delay": micros(f.RetryDelay), "reason": f.Reason, "now": c.nowArg()}
	if f.DeadLetterPolicy == DeadLetterSkip {
		return c.failSkip(ctx, vals)
	}
	var status string
	found := false
	if c.dialect == MySQL {
		err := c.inTxRetry(ctx, "fail", nil, func(tx Tx) error {
			found, status = false, ""
			res, err := tx.ExecContext(ctx, c.stmts.fail.text, c.stmts.fail.args(vals)...)
			if err != nil {
				return err
			}
			if n, _ := res.RowsAffected(); n != 1 {
				return nil
			}
			found = true
			rows, err := tx.QueryContext(ctx, c.stmts.failStatus.text, c.stmts.failStatus.args(vals)...)
			if err != nil {
				return err
			}
			defer rows.Close()
			if rows.Next() {
				var stream, group, okey string
				return rows.Scan(&status, &stream, &group, &okey)
			}
			return rowsErr(rows)
		})
		if err != nil {
			return FailOutcome{}, err
		}
	} else {
		err := c.retryConflicts(ctx, "fail", func() error {
			found, status = false, ""
			rows, err := c.db.QueryContext(ctx, c.stmts.fail.text, c.stmts.fail.args(vals)...)
			if err != nil {
				return err
			}
			defer rows.Close()
			if rows.Next() {
				found = true
				if err := rows.Scan(&status); err != nil {
					return err
				}
			}
			if err := rowsErr(rows); err != nil {
				return err
			}
			return rows.Close()
		})
		if err != nil {
			return FailOutcome{}, err
		}
	}
	if !found {
		return FailOutcome{}, ErrStaleClaim // the caller names the event
	}
	return FailOutcome{DeadLettered: status == StatusDead}, nil
}

// ExtendBatch moves the lease of every live claim in rs to now+lease and
// returns the new expiry and the receipts that were stale.
func (c *Core) ExtendBatch(ctx context.Context, rs []Receipt, lease time.Duration) (time.Time, []Receipt, error) {
	if err := validateReceipts(rs); err != nil {
		return time.Time{}, nil, err
	}
	if err := ValidateLease(lease); err != nil {
		return time.Time{}, nil, err
	}
	extended := map[int64]bool{}
	var expires int64
	scan := func(ex Executor, text string, args []any) error {
		rows, err := ex.QueryContext(ctx, text, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id, exp int64
			if err := rows.Scan(&id, &exp); err != nil {
				return err
			}
			extended[id], expires = true, exp
		}
		if err := rowsErr(rows); err != nil {
			return err
		}
		return rows.Close()
	}
	var err error
	ordered := inIDOrder(rs)
	switch c.dialect {
	case Postgres:
		ids, keys := splitReceipts(ordered)
		err = c.retryConflicts(ctx, "extend", func() error {
			clear(extended)
			return scan(c.db, c.stmts.extend.text, c.stmts.extend.args(map[string]any{"ids": ids, "keys": keys, "lease": micros(lease), "now": c.nowArg()}))
		})
	case SQLite:
		text, extra := expandPairs(c.dialect, c.stmts.extend.text, ordered)
		err = c.retryConflicts(ctx, "extend", func() error {
			clear(extended)
			return scan(c.db, text, append(c.stmts.extend.args(map[string]any{"lease": micros(lease), "now": c.nowArg()}), extra...))
		})
	case MySQL:
		err = c.inTxRetry(ctx, "extend", &sql.TxOptions{Isolation: sql.LevelReadCommitted}, func(tx Tx) error {
			clear(extended)
			now, err := c.resolveNow(ctx, tx)
			if err != nil {
				return err
			}
			text, extra := expandPairs(c.dialect, c.stmts.extend.text, ordered)
			if _, err := tx.ExecContext(ctx, text, append(c.stmts.extend.args(map[string]any{"lease": micros(lease), "now": now}), extra...)...); err != nil {
				return err
			}
			text, extra = expandPairs(c.dialect, c.stmts.extendCheck.text, ordered)
			return scan(tx, text, append(c.stmts.extendCheck.args(map[string]any{"expires": now + micros(lease)}), extra...))
		})
	}
	if err != nil {
		return time.Time{}, nil, err
	}
	var stale []Receipt
	for _, r := range rs {
		if !extended[r.ID] {
			stale = append(stale, r)
		}
	}
	return fromMicros(expires), stale, nil
}

// Release hands claimed events back without counting the attempt, for events
// claimed but never given to a handler. Only live claims are released; a
// stale receipt (wrong key, expired lease) changes nothing, so a late
// release cannot refund an attempt. It returns how many were released.
func (c *Core) Release(ctx context.Context, rs []Receipt) (int, error) {
	if err := validateReceipts(rs); err != nil {
		return 0, err
	}
	var text string
	var args []any
	ordered := inIDOrder(rs)
	if c.dialect == Postgres {
		ids, keys := splitReceipts(ordered)
		text, args = c.stmts.release.text, c.stmts.release.args(map[string]any{"ids": ids, "keys": keys, "now": c.nowArg()})
	} else {
		var extra []any
		text, extra = expandPairs(c.dialect, c.stmts.release.text, ordered)
		args = append(c.stmts.release.args(map[string]any{"now": c.nowArg()}), extra...)
	}
	n, err := c.execCount(ctx, "release", text, args)
	return int(n), err
}

// execCount runs one autocommit statement of the store's own, retrying
// conflicts, and returns how many rows it changed.
func (c *Core) execCount(ctx context.Context, what, text string, args []any) (int64, error) {
	var n int64
	err := c.retryConflicts(ctx, what, func() error {
		res, err := c.db.ExecContext(ctx, text, args...)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	return n, err
}

// DeadQuery selects dead-lettered events of one stream.
type DeadQuery struct {
	// Stream to list.
	Stream string
	// Group to list; ignored when AllGroups is set.
	Group string
	// AllGroups lists every consumer group of the stream.
	AllGroups bool
	// AfterID pages: only ids above it are listed.
	AfterID int64
	// Limit is the page size (1-MaxBatch).
	Limit int
}

// ListDead lists dead-lettered events, oldest first.
func (c *Core) ListDead(ctx context.Context, q DeadQuery) ([]DeadEvent, error) {
	if err := ValidateKey("stream", q.Stream); err != nil {
		return nil, err
	}
	if err := ValidateGroup(q.Group); err != nil {
		return nil, err
	}
	if err := ValidateBatch(q.Limit); err != nil {
		return nil, err
	}
	if q.AfterID < 0 {
		return nil, fmt.Errorf("after id %d is negative: %w", q.AfterID, ErrInvalidID)
	}
	st := c.stmts.listDead
	rows, err := c.db.QueryContext(ctx, st.text, st.args(map[string]any{
		"stream": q.Stream, "group": q.Group, "all_groups": q.AllGroups, "after": q.AfterID, "limit": q.Limit,
	})...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []DeadEvent
	for rows.Next() {
		var d DeadEvent
		var created int64
		if err := rows.Scan(&d.ID, &d.Stream, &d.Group, &d.Key, &d.Kind, &d.Attempts, &d.LastError, &created); err != nil {
			return nil, err
		}
		d.CreatedAt = fromMicros(created)
		out = append(out, d)
	}
	if err := rowsErr(rows); err != nil {
		return nil, err
	}
	return out, rows.Close()
}

// Requeue makes dead-lettered events of the stream pending again with their
// attempts reset, and returns how many it requeued.
func (c *Core) Requeue(ctx context.Context, stream string, ids []int64) (int, error) {
	if err := ValidateKey("stream", stream); err != nil {
		return 0, err
	}
	if err := validateIDs(ids); err != nil {
		return 0, err
	}
	st := c.stmts.requeue
	var text string
	var args []any
	ids = slices.Sorted(slices.Values(ids)) // lock in id order; see inIDOrder
	if c.dialect == Postgres {
		text, args = st.text, st.args(map[string]any{"stream": stream, "ids": ids, "now": c.nowArg()})
	} else {
		var extra []any
		text, extra = expandIDs(st.text, ids)
		args = append(st.args(map[string]any{"stream": stream, "now": c.nowArg()}), extra...)
	}
	n, err := c.execCount(ctx, "requeue", text, args)
	if err != nil {
		return 0, err
	}
	m, err := c.requeueOrdered(ctx, stream, ids)
	return int(n) + m, err
}

// Reroute moves dead-lettered events of the stream's default group ("",
// where events wait that no group took when they were enqueued) to the
// groups that take their kind now, as pending deliveries with fresh
// attempts. An event no group takes yet stays where it is. It returns how
// many events it moved.
func (c *Core) Reroute(ctx context.Context, stream string, ids []int64) (int, error) {
	if err := ValidateKey("stream", stream); err != nil {
		return 0, err
	}
	if err := validateIDs(ids); err != nil {
		return 0, err
	}
	moved := 0
	// In READ COMMITTED on MySQL, as the other settlers: the promotion that
	// releasing a held key runs reads the events producers committed while
	// it waited for the key, not a snapshot from before.
	var opts *sql.TxOptions
	if c.dialect == MySQL {
		opts = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}
	err := c.inTxRetry(ctx, "reroute", opts, func(tx Tx) error {
		moved = 0
		for _, id := range ids {
			// A locking read: a concurrent Reroute (or discard, requeue)
			// of the same row waits, then finds it gone or changed.
			kind, err := c.queryString(ctx, tx, c.stmts.deadKind, map[string]any{"id": id, "stream": stream})
			if err != nil {
				return err
			}
			if len(kind) == 0 {
				continue // not a dead default-group row of this stream
			}
			groups, err := c.queryString(ctx, tx, c.stmts.kindGroups, map[string]any{"stream": stream, "kind": kind[0]})
			if err != nil {
				return err
			}
			if len(groups) == 0 {
				continue
			}
			// The copies are delivered without their ordering key; a
			// dead row that still held its key in the default group
			// releases it when it leaves.
			okey, held, err := c.deadOrdering(ctx, tx, id)
			if err != nil {
				return err
			}
			for _, g := range groups {
				st := c.stmts.copyToGroup
				if _, err := tx.ExecContext(ctx, st.text, st.args(map[string]any{"group": g, "now": c.nowArg(), "id": id})...); err != nil {
					return err
				}
			}
			if n, err := c.deleteDeliveries(ctx, tx, []int64{id}); err != nil || n != 1 {
				if err == nil {
					err = fmt.Errorf("reroute: dead letter %d locked but not deleted", id)
				}
				return err
			}
			if okey != "" && held {
				if err := c.releaseKeys(ctx, tx, []orderKey{{stream: stream, group: "", key: okey}}); err != nil {
					return err
				}
			}
			moved++
		}
		return nil
	})
	return moved, err
}

// queryString runs a query whose first column is text and returns it.
func (c *Core) queryString(ctx context.Context, ex Executor, q query, vals map[string]any) ([]string, error) {
	rows, err := ex.QueryContext(ctx, q.text, q.args(vals)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	if err := rowsErr(rows); err != nil {
		return nil, err
	}
	return out, rows.Close()
}

// Purge deletes up to limit delivered rows delivered more than olderThan
// ago, oldest first, and returns how many it deleted; with deleteOnAck
// then, within the limit, events created before the horizon that no
// delivery row points at (counted too). Purged keys may be
// enqueued again: the idempotency window is the retention horizon.
func (c *Core) Purge(ctx context.Context, olderThan time.Duration, limit int) (int64, error) {
	if olderThan < 0 {
		return 0, fmt.Errorf("purge horizon %s is negative: %w", olderThan, ErrInvalidHorizon)
	}
	if limit < 1 || limit > MaxPurgeBatch {
		return 0, fmt.Errorf("purge limit %d is outside 1-%d: %w", limit, MaxPurgeBatch, ErrInvalidBatch)
	}
	vals := map[string]any{"horizon": micros(olderThan), "limit": limit, "now": c.nowArg()}
	// The oldest deliveries are picked (on PostgreSQL locked in id order;
	// on MySQL with a plain read, then deleted by id, in id order: a DELETE
	// ... ORDER BY delivered_at would lock rows in delivery order), and
	// deleted with the events they leave without rows.
	var n int64
	var opts *sql.TxOptions
	if c.dialect == MySQL {
		opts = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}
	err := c.inTxRetry(ctx, "purge", opts, func(tx Tx) error {
		n = 0
		ids, err := c.queryIDs(ctx, tx, c.stmts.purgeSelect.text, c.stmts.purgeSelect.args(vals))
		if err != nil {
			return err
		}
		if len(ids) > 0 {
			if n, err = c.deleteDeliveries(ctx, tx, slices.Sorted(maps.Keys(ids))); err != nil {
				return err
			}
		}
		if !c.deleteOnAck || n >= int64(limit) {
			return nil
		}
		// Then, up to the limit, the events older than the horizon that
		// no delivery row points at (with deleteOnAck, acknowledged events
		// and those whose rows were discarded).
		m, err := c.purgeEvents(ctx, tx, map[string]any{"horizon": vals["horizon"], "limit": limit - int(n), "now": vals["now"]})
		n += m
		return err
	})
	return n, err
}

// CountPurgeable counts what Purge(olderThan, no limit) would delete now,
// with a plain read that locks nothing: the delivered rows delivered more
// than olderThan ago and, with deleteOnAck, the events created before the
// horizon that no delivery row points at once those rows are gone (rows
// delivered before the option was set go first, then their events). It is
// a snapshot: rows delivered
// or acknowledged meanwhile are purged too.
func (c *Core) CountPurgeable(ctx context.Context, olderThan time.Duration) (int64, error) {
	if olderThan < 0 {
		return 0, fmt.Errorf("purge horizon %s is negative: %w", olderThan, ErrInvalidHorizon)
	}
	vals := map[string]any{"horizon": micros(olderThan), "now": c.nowArg()}
	n, err := c.queryInt(ctx, c.db, c.stmts.purgeCount, vals)
	if err != nil || !c.deleteOnAck {
		return n, err
	}
	m, err := c.queryInt(ctx, c.db, c.stmts.purgeEventsCount, vals)
	return n + m, err
}

// purgeEvents (deleteOnAck) deletes up to vals["limit"] events created
// before the horizon that no delivery row points at, and returns how many.
func (c *Core) purgeEvents(ctx context.Context, tx Executor, vals map[string]any) (int64, error) {
	ids, err := c.queryIDs(ctx, tx, c.stmts.purgeEvents.text, c.stmts.purgeEvents.args(vals))
	if err != nil || len(ids) == 0 {
		return 0, err
	}
	text, args := c.withIDs(c.stmts.dropOrphans, map[string]any{}, slices.Sorted(maps.Keys(ids)))
	res, err := tx.ExecContext(ctx, text, args...)
	if err != nil {
		return 0, fmt.Errorf("delete events without rows: %w", err)
	}
	return res.RowsAffected()
}

// Stats counts undelivered rows per stream and consumer group.
func (c *Core) Stats(ctx context.Context) ([]StreamStats, error) {
	st := c.stmts.stats
	rows, err := c.db.QueryContext(ctx, st.text, st.args(map[string]any{"now": c.nowArg()})...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []StreamStats
	for rows.Next() {
		var s StreamStats
		var oldest, now int64
		if err := rows.Scan(&s.Stream, &s.Group, &s.Pending, &s.Processing, &s.Dead, &s.Retrying, &oldest, &now, &s.Blocked, &s.HeldKeys); err != nil {
			return nil, err
		}
		if oldest > 0 && now > oldest {
			s.OldestPendingAge = time.Duration(now-oldest) * time.Microsecond
		}
		out = append(out, s)
	}
	if err := rowsErr(rows); err != nil {
		return nil, err
	}
	return out, rows.Close()
}

// RegisterGroup durably subscribes a consumer group to a stream, for the
// given event kinds or, with none, for every kind: from then on every
// matching event enqueued to the stream gets a delivery row for the group.
// It adds to what the group had; it is idempotent.
func (c *Core) RegisterGroup(ctx context.Context, stream, group string, kinds ...string) error {
	kinds, err := validateSubscription(stream, group, kinds)
	if err != nil {
		return err
	}
	return c.inTxRetry(ctx, "register group", nil, func(tx Tx) error { return c.register(ctx, tx, stream, group, kinds) })
}

// SetGroupKinds makes the group's subscription to the stream exactly the
// given kinds (none: every kind), in one transaction: kinds it had and no
// longer lists stop getting rows, so an event of such a kind falls to the
// default group (or to other groups) instead of to a consumer that no longer
// handles it.
func (c *Core) SetGroupKinds(ctx context.Context, stream, group string, kinds ...string) error {
	kinds, err := validateSubscription(stream, group, kinds)
	if err != nil {
		return err
	}
	return c.inTxRetry(ctx, "set group kinds", nil, func(tx Tx) error {
		if err := c.register(ctx, tx, stream, group, kinds); err != nil {
			return err
		}
		rows, err := tx.QueryContext(ctx, c.stmts.groupKinds.text, c.stmts.groupKinds.args(map[string]any{"stream": stream, "group": group})...)
		if err != nil {
			return err
		}
		var stale []string
		for rows.Next() {
			var kind string
			if err := rows.Scan(&kind); err != nil {
				rows.Close()
				return err
			}
			if !slices.Contains(kinds, kind) {
				stale = append(stale, kind)
			}
		}
		if err := rowsErr(rows); err != nil {
			rows.Close()
			return err
		}
		rows.Close()
		for _, kind := range stale {
			st := c.stmts.dropKind
			if _, err := tx.ExecContext(ctx, st.text, st.args(map[string]any{"stream": stream, "group": group, "kind": kind})...); err != nil {
				return err
			}
		}
		return nil
	})
}

func validateSubscription(stream, group string, kinds []string) ([]string, error) {
	if err := ValidateKey("stream", stream); err != nil {
		return nil, err
	}
	if err := ValidateGroup(group); err != nil {
		return nil, err
	}
	if len(kinds) == 0 {
		return []string{""}, nil
	}
	for _, kind := range kinds {
		if err := ValidateKey("event kind", kind); err != nil {
			return nil, err
		}
	}
	return kinds, nil
}

func (c *Core) register(ctx context.Context, ex Executor, stream, group string, kinds []string) error {
	st := c.stmts.register
	for _, kind := range kinds {
		if _, err := ex.ExecContext(ctx, st.text, st.args(map[string]any{"stream": stream, "group": group, "kind": kind, "now": c.nowArg()})...); err != nil {
			return err
		}
	}
	return nil
}

// UnregisterGroup removes a group's subscription; rows already written for
// it stay until they are consumed or purged.
func (c *Core) UnregisterGroup(ctx context.Context, stream, group string) error {
	if err := ValidateKey("stream", stream); err != nil {
		return err
	}
	if err := ValidateGroup(group); err != nil {
		return err
	}
	st := c.stmts.unregister
	_, err := c.db.ExecContext(ctx, st.text, st.args(map[string]any{"stream": stream, "group": group})...)
	return err
}
