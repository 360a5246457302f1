package sqlcore

import (
	"context"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"
)

// ErrHeldSettled reports a held claim used after Settle or Abort ended it.
var ErrHeldSettled = errors.New("held claim already settled or aborted")

// Held claims (PostgreSQL, MySQL). A claim that writes a lease updates every row
// it takes, and its acknowledgement updates it again, checking the claim
// key. A held claim instead locks the due rows in a transaction of its own
// (SELECT ... FOR UPDATE SKIP LOCKED) and leaves them unchanged until the
// holder settles them in that transaction: a delivered row is written once.
// Other claims skip the locked rows as they skip leased ones. When the
// holder dies, its session ends and the rows are due again at once, as they
// were; a holder whose transaction stays idle longer than the request's
// lease is ended by the database (idle_in_transaction_session_timeout).
//
// Measured on 20,000 events claimed and acknowledged 1,000 at a time by one
// client (the database's and the client's time): about 11 µs per event
// held against 20 µs leased, keeping delivered rows; 5.6 against 14 µs
// deleting them.
//
// On MySQL the due rows are found with the leased claim's plain read and
// locked with its locking read (SKIP LOCKED); the database ends a stalled
// holder's session through its wait_timeout, which the claim sets for its
// session (whole seconds, rounded up) once it holds rows and restores
// before its transaction ends. MariaDB 10.11, 20,000 events claimed and
// settled 1,000 at a time by one client: about 18 µs per event held
// against 32-39 µs leased, deleting them; 26-31 against 35 µs keeping them.
const (
	// The outer read is under the statement's snapshot: a due row another
	// transaction changed and committed just after it (claimed and
	// released again, say) is locked in its new version but reported as
	// the old one. Reading the columns from the locking CTE instead (a
	// MATERIALIZED CTE joined to the events) measured 10% faster alone but
	// doubled the relay's database CPU per event (19 -> 40 us, bench
	// -relay), so this stays.
	heldClaimPG = `WITH due AS (
  SELECT id FROM millpond_deliveries
  WHERE stream = @stream AND consumer_group = @group AND NOT settled AND available_at <= @now AND id + 0 > @after::BIGINT
  ORDER BY id + 0 LIMIT @limit
  FOR UPDATE SKIP LOCKED
)
SELECT d.id, e.event_key, e.event_kind, e.payload, e.metadata, d.attempts + 1, e.created_at, d.ordering_key, d.ordering_seq, d.status = 'processing',
  ` + "(d.attempts >= @max AND (@hold OR d.ordering_key = ''))" + `
FROM millpond_deliveries d JOIN millpond_events e ON e.id = d.event_id
WHERE d.id = ANY(ARRAY(SELECT id FROM due))
  AND (SELECT set_config('idle_in_transaction_session_timeout', @idle::TEXT, true)) IS NOT NULL`
	// Due rows whose attempts are used up (a leased claim's lease expired
	// after the final attempt) are dead-lettered as a leased claim does.
	// Under DeadLetterSkip one with an ordering key is handed out once more
	// (a leased claim settles it through the skip path instead): a failed
	// attempt then dead-letters it through Fail, which lets its key go.
	heldDeadPG = `UPDATE millpond_deliveries SET status = 'dead_letter', settled = true, claim_key = '', claimed_by = @worker,
  last_error = CASE WHEN status = 'processing' THEN '` + lastErrorLeaseExpired + `' ELSE last_error END
WHERE id = ANY(@ids::BIGINT[])`
	// The delivered rows without an ordering key: marked as an
	// acknowledgement marks them, with the attempt counted and the worker
	// named as a claim would have.
	heldDeliverPG = `UPDATE millpond_deliveries SET status = 'delivered', settled = true, delivered_at = @now,
  attempts = attempts + 1, claimed_by = @worker, claim_key = ''
WHERE id = ANY(@ids::BIGINT[])`
	heldDeletePG = `DELETE FROM millpond_deliveries WHERE id = ANY(@ids::BIGINT[])`
	// heldLivePG names the held rows @ids as the acknowledgement's live
	// rows (see liveClaims): the transaction holds their locks already.
	heldLivePG = `WITH live AS MATERIALIZED (
  SELECT o.id, o.stream, o.consumer_group, o.ordering_key FROM millpond_deliveries o
  WHERE o.id = ANY(@ids::BIGINT[])
  ORDER BY o.id
  FOR UPDATE OF o
)`
	// Rows that need the leased path (a failed publish, an event with an
	// ordering key) become ordinary claims first: processing under a lease
	// with a fresh claim key, one more attempt.
	heldLeasePG = `UPDATE millpond_deliveries o SET status = 'processing', settled = false, attempts = o.attempts + 1,
  claimed_by = @worker, claim_key = u.claim_key, available_at = @now + @lease::BIGINT
FROM unnest(@ids::BIGINT[], @keys::TEXT[]) AS u(id, claim_key)
WHERE o.id = u.id`
)

// MySQL's held statements. An event with an ordering key is settled as a
// leased claim (heldLeaseMySQL, then the acknowledgement's statements).
var (
	heldDeliverMySQL = "UPDATE " + mysqlSettleRows + `
SET d.status = 'delivered', d.delivered_at = @now, d.attempts = d.attempts + 1, d.claimed_by = @worker, d.claim_key = ''`
	heldDeleteMySQL = "DELETE d FROM " + mysqlSettleRows
	heldLeaseMySQL  = `UPDATE JSON_TABLE(@pairs, '$[*]' COLUMNS (id BIGINT PATH '$[0]', claim_key VARCHAR(32) PATH '$[1]')) u
STRAIGHT_JOIN millpond_deliveries o FORCE INDEX (PRIMARY) ON o.id = u.id
SET o.status = 'processing', o.attempts = o.attempts + 1, o.claimed_by = @worker, o.claim_key = u.claim_key,
  o.available_at = @now + @lease`
)

// The session's wait_timeout while a MySQL claim is held, and restored
// before its transaction ends (to what it was, kept in a session variable).
const (
	heldSessionMySQL  = "SET @millpond_wait_timeout = @@SESSION.wait_timeout, SESSION wait_timeout = ?"
	heldRestoreMySQL  = "SET SESSION wait_timeout = @millpond_wait_timeout"
	heldRestoreBudget = 5 * time.Second
)

// Held is an open held claim: its transaction and the rows it holds.
type Held struct {
	c    *Core
	req  ClaimRequest
	mu   sync.Mutex
	tx   Tx
	rows map[int64]string // id -> ordering key
	// end cancels the transaction's context: a transaction keeps the
	// context it began with (for its commit too), so it begins with one
	// that outlives the claim's and that Settle's ends early.
	end context.CancelFunc
}

// ClaimHeld takes up to req.Limit due events, oldest first, as Claim does,
// but holds them in an open transaction instead of writing a lease (see
// Held). Nothing is written until Settle. The events come back with
// Attempts counting this attempt, no claim key, and LeaseExpiresAt the
// latest the claim can stay idle. When none is due it returns no events
// and a nil Held. PostgreSQL and MySQL hold claims: on SQLite the error
// wraps errors.ErrUnsupported.
func (c *Core) ClaimHeld(ctx context.Context, req ClaimRequest) (*Held, []Claimed, error) {
	if err := req.Validate(); err != nil {
		return nil, nil, err
	}
	var due map[int64]bool
	switch c.dialect {
	case Postgres:
	case MySQL:
		// Found before the transaction begins, as a leased claim finds
		// them: a poll that finds nothing due is one statement.
		vals := map[string]any{"stream": req.Stream, "group": req.Group, "limit": req.Limit, "now": c.nowArg(), "after": req.After}
		var err error
		if due, err = c.queryIDs(ctx, c.db, c.stmts.claimDue.text, c.stmts.claimDue.args(vals)); err != nil || len(due) == 0 {
			return nil, nil, err
		}
	default:
		return nil, nil, fmt.Errorf("held claims need PostgreSQL or MySQL, not %s: %w", c.dialect, errors.ErrUnsupported)
	}
	txCtx, end := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, end)
	tx, err := c.db.BeginTx(txCtx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if !stop() { // ctx ended while the transaction began
		if err == nil {
			_ = tx.Rollback()
		}
		return nil, nil, context.Cause(ctx)
	}
	if err != nil {
		end()
		return nil, nil, err
	}
	var out []Claimed
	if c.dialect == MySQL {
		out, err = c.claimHeldMySQL(ctx, tx, req, due)
	} else {
		out, err = c.claimHeld(ctx, tx, req)
	}
	if err != nil || len(out) == 0 {
		_ = tx.Rollback()
		end()
		return nil, nil, err
	}
	h := &Held{c: c, req: req, tx: tx, end: end, rows: make(map[int64]string, len(out))}
	for _, cl := range out {
		h.rows[cl.ID] = cl.OrderingKey
	}
	return h, out, nil
}

func (c *Core) claimHeld(ctx context.Context, tx Tx, req ClaimRequest) ([]Claimed, error) {
	// The database ends the transaction (and the session) when it stays
	// idle longer than the lease: a stalled holder cannot keep the rows.
	// The claim sets that for its transaction itself (set_config, once, in
	// an uncorrelated subquery): no round trip of its own.
	idle := strconv.FormatInt(max(req.Lease.Milliseconds(), 1), 10)
	q := c.stmts.claimHeld
	rows, err := tx.QueryContext(ctx, q.text, q.args(map[string]any{
		"stream": req.Stream, "group": req.Group, "limit": req.Limit, "now": c.nowArg(), "after": req.After,
		"max": req.MaxAttempts, "hold": req.DeadLetterPolicy == DeadLetterHold, "idle": idle,
	})...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	expires := time.Now().Add(req.Lease).UTC()
	out := make([]Claimed, 0, req.Limit)
	var cl Claimed
	var md string
	var created int64
	var exhausted bool
	var dead []int64
	dest := []any{&cl.ID, &cl.Key, &cl.Kind, &cl.Payload, &md, &cl.Attempts, &created, &cl.OrderingKey, &cl.OrderingSeq, &cl.Reclaimed, &exhausted}
	for rows.Next() {
		cl = Claimed{}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		if exhausted {
			dead = append(dead, cl.ID)
			continue
		}
		cl.Stream, cl.Group = req.Stream, req.Group
		if cl.Metadata, err = decodeMetadata(md); err != nil {
			return nil, err
		}
		cl.CreatedAt, cl.LeaseExpiresAt = fromMicros(created), expires
		out = append(out, cl)
	}
	if err := rowsErr(rows); err != nil {
		return nil, err
	}
	if err := rows.Close(); err != nil {
		return nil, err
	}
	if len(dead) > 0 {
		q := c.stmts.heldDead
		if _, err := tx.ExecContext(ctx, q.text, q.args(map[string]any{"ids": dead, "worker": req.Worker})...); err != nil {
			return nil, err
		}
		if len(out) == 0 {
			// Nothing to hold: the dead letters commit on their own.
			return nil, tx.Commit()
		}
	}
	slices.SortFunc(out, byID)
	return out, nil
}

// claimHeldMySQL locks the due rows (found before the transaction began)
// that no other transaction holds and reads their events: the rows stay
// as they were. Rows whose attempts are used up are dead-lettered, as by
// claimHeld. Once it holds rows the session's wait_timeout becomes the
// lease.
func (c *Core) claimHeldMySQL(ctx context.Context, tx Tx, req ClaimRequest, due map[int64]bool) ([]Claimed, error) {
	out, eventIDs, dead, _, err := c.lockDueMySQL(ctx, tx, req, due)
	if err != nil {
		return nil, err
	}
	if len(dead) > 0 {
		if err := c.deadLetterExhaustedMySQL(ctx, tx, req, dead); err != nil {
			return nil, err
		}
		if len(out) == 0 {
			return nil, tx.Commit() // nothing to hold: the dead letters commit on their own
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	if out, err = c.withContent(ctx, tx, out, eventIDs); err != nil || len(out) == 0 {
		return nil, err
	}
	expires := time.Now().Add(req.Lease).UTC()
	for i := range out {
		out[i].Attempts++
		out[i].ClaimKey = ""
		out[i].LeaseExpiresAt = expires
	}
	secs := int64((req.Lease + time.Second - 1) / time.Second)
	if _, err := tx.ExecContext(ctx, heldSessionMySQL, secs); err != nil {
		return nil, err
	}
	return out, nil
}

// Settle ends the held claim, committing: the events delivered are
// acknowledged (marked delivered, or deleted with WithDeleteOnAck; an event
// with an ordering key hands its key to the next event, as Acknowledge
// does), the events in lease become ordinary claims under the request's
// lease (one more attempt, a fresh claim key: their receipts are returned,
// for Fail or Acknowledge), and every other held event is left as it was,
// due again. An id the claim does not hold, or named twice, is refused with
// ErrInvalidID and the claim stays open. When the commit fails nothing is
// settled: the events are due again.
func (h *Held) Settle(ctx context.Context, delivered, lease []int64) ([]Receipt, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.tx == nil {
		return nil, ErrHeldSettled
	}
	seen := make(map[int64]bool, len(delivered)+len(lease))
	for _, id := range slices.Concat(delivered, lease) {
		if _, ok := h.rows[id]; !ok || seen[id] {
			return nil, fmt.Errorf("held claim: event %d is not held or named twice: %w", id, ErrInvalidID)
		}
		seen[id] = true
	}
	tx := h.tx
	h.tx = nil
	defer h.end()
	if h.c.dialect == MySQL {
		// The transaction's context must not end while it is open: when it
		// does, database/sql rolls the transaction back on its own and
		// keeps the connection (go-sql-driver can reset sessions), which
		// would then carry the claim's wait_timeout into the pool,
		// restoreSession having no transaction left to run in. Each
		// statement is bounded by ctx instead (the driver closes the
		// connection of a statement whose context ends), and an ended
		// ctx stops the settle before its commit.
		return h.commit(tx, func() ([]Receipt, error) {
			receipts, err := h.settle(ctx, tx, delivered, lease)
			if err == nil {
				_, err = tx.ExecContext(ctx, heldRestoreMySQL)
			}
			if err == nil {
				err = context.Cause(ctx)
			}
			return receipts, err
		})
	}
	stop := context.AfterFunc(ctx, h.end) // ctx bounds the commit too
	defer stop()
	return h.commit(tx, func() ([]Receipt, error) { return h.settle(ctx, tx, delivered, lease) })
}

// commit runs settle in tx, then commits; when settle fails it gives the
// session back (restoreSession) and rolls back.
func (h *Held) commit(tx Tx, settle func() ([]Receipt, error)) ([]Receipt, error) {
	receipts, err := settle()
	if err != nil {
		h.restoreSession(tx)
		_ = tx.Rollback()
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, err
	}
	return receipts, nil
}

func (h *Held) settle(ctx context.Context, tx Tx, delivered, lease []int64) ([]Receipt, error) {
	c := h.c
	var plain, ordered []int64
	for _, id := range delivered {
		if h.rows[id] == "" {
			plain = append(plain, id)
		} else {
			ordered = append(ordered, id)
		}
	}
	slices.Sort(plain)
	slices.Sort(ordered)
	vals := map[string]any{"now": c.nowArg(), "worker": h.req.Worker}
	if len(plain) > 0 {
		vals["ids"] = plain
		if c.dialect == MySQL {
			vals["ids"] = jsonIDs(plain)
		}
		q := c.stmts.heldDeliver
		if _, err := tx.ExecContext(ctx, q.text, q.args(vals)...); err != nil {
			return nil, err
		}
	}
	// Delivered events with an ordering key are acknowledged by the
	// leased acknowledgement's statement over the held rows, which counts
	// them off their keys and promotes the keys' next events. The ones it
	// leaves (a producer of the key committed while it waited for the
	// key's row) are acknowledged as leased claims below, whose path
	// settles them in later statements.
	leased := slices.Clone(lease)
	if c.dialect == MySQL {
		leased = append(leased, ordered...)
	} else if len(ordered) > 0 {
		vals["ids"] = ordered
		q := c.stmts.heldAck
		acked, err := c.queryIDs(ctx, tx, q.text, q.args(vals))
		if err != nil {
			return nil, err
		}
		for _, id := range ordered {
			if !acked[id] {
				leased = append(leased, id)
			}
		}
	}
	slices.Sort(leased)
	if len(leased) == 0 {
		return nil, nil
	}
	keys := make([]string, len(leased))
	raw := claimKeyBytes(len(leased))
	for i := range keys {
		keys[i] = hex.EncodeToString(raw[16*i : 16*i+16])
	}
	vals["ids"], vals["keys"], vals["lease"] = leased, keys, micros(h.req.Lease)
	if c.dialect == MySQL {
		vals["pairs"] = jsonPairs(leased, keys)
	}
	q := c.stmts.heldLease
	if _, err := tx.ExecContext(ctx, q.text, q.args(vals)...); err != nil {
		return nil, err
	}
	all := make([]Receipt, len(leased))
	var acks []Receipt
	inLease := make(map[int64]bool, len(lease))
	for _, id := range lease {
		inLease[id] = true
	}
	for i, id := range leased {
		all[i] = Receipt{ID: id, ClaimKey: keys[i]}
		if !inLease[id] {
			acks = append(acks, all[i])
		}
	}
	if len(acks) > 0 {
		stale, err := c.AcknowledgeInTx(ctx, tx, acks)
		if err != nil {
			return nil, err
		}
		if len(stale) > 0 {
			return nil, fmt.Errorf("held claim: %d held events with ordering keys could not be acknowledged", len(stale))
		}
	}
	out := make([]Receipt, 0, len(lease))
	for _, r := range all {
		if inLease[r.ID] {
			out = append(out, r)
		}
	}
	return out, nil
}

// Abort ends the held claim without settling anything: every event it held
// is due again, unchanged. Aborting an ended claim does nothing.
//
// A transaction's Rollback has no deadline (the pgx adapter rolls back
// under a context that cannot end), so on a database that does not answer
// it would wait forever, keeping its pooled connection: closing the pool
// would then wait too. The claim therefore rolls back with a statement
// first, bounded as any statement of a holder (max(Lease/2, 5 s)): when
// the bound passes the driver drops the connection, and the Rollback that
// follows returns at once.
func (h *Held) Abort() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.tx == nil {
		return nil
	}
	tx := h.tx
	h.tx = nil
	defer h.end()
	ctx, cancel := context.WithTimeout(context.Background(), max(h.req.Lease/2, 5*time.Second))
	defer cancel()
	_, err := tx.ExecContext(ctx, "ROLLBACK")
	if err == nil && h.c.dialect == MySQL {
		_, err = tx.ExecContext(ctx, heldRestoreMySQL)
	}
	if rerr := tx.Rollback(); err == nil {
		err = rerr
	}
	return err
}

// restoreSession gives a MySQL session its wait_timeout back before a
// failed settle rolls back, so that its pooled connection does not carry
// the held claim's into other transactions. It is best effort: a session
// it cannot reach is gone, or will be once its wait_timeout passes.
func (h *Held) restoreSession(tx Tx) {
	if h.c.dialect != MySQL {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), heldRestoreBudget)
	defer cancel()
	_, _ = tx.ExecContext(ctx, heldRestoreMySQL)
}

// jsonPairs is ids and keys as a JSON array of [id, key] pairs, the @pairs
// of heldLeaseMySQL. The keys are hexadecimal: nothing to escape.
func jsonPairs(ids []int64, keys []string) string {
	b := make([]byte, 0, 48*len(ids)+2)
	b = append(b, '[')
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '[')
		b = strconv.AppendInt(b, id, 10)
		b = append(b, ',', '"')
		b = append(b, keys[i]...)
		b = append(b, '"', ']')
	}
	return string(append(b, ']'))
}
