package sqlcore

import (
	"context"
	"database/sql"
	"strings"
	"sync"
	"testing"
	"time"
)

// On MySQL an acknowledgement whose receipts are all live and without an
// ordering key is one UPDATE in a transaction of its own (ackAllMySQL):
// no locking read of the receipts first. A batch it cannot settle whole
// (here: two receipts holding each other's claim keys, and a stale one)
// changes nothing by that UPDATE and is settled the usual way.
func TestMySQLAckOfLiveReceiptsIsOneUpdate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, rec, db := recordingMySQLCore(ctx, t)
	execAll(ctx, t, db,
		`INSERT INTO millpond_events (created_at, stream, event_key, event_kind, content_hash, metadata, payload)
SELECT 0, 's', CONCAT('k', a.d, b.d), 'K', UNHEX(SHA2('', 256)), '{}', '{}' FROM `+digits+` a, `+digits+` b`,
		`INSERT INTO millpond_deliveries (event_id, stream, consumer_group, status, available_at)
SELECT id, 's', '', 'pending', 0 FROM millpond_events ORDER BY id`)
	claimed, err := c.Claim(ctx, ClaimRequest{Stream: "s", Worker: "w", Limit: 100, Lease: time.Minute, MaxAttempts: 3})
	if err != nil || len(claimed) != 100 {
		t.Fatalf("claim: %d rows, %v", len(claimed), err)
	}
	status := func(id int64) string {
		var s string
		if err := db.QueryRowContext(ctx, "SELECT status FROM millpond_deliveries WHERE id = ?", id).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}

	// 98 live receipts: settled by one UPDATE.
	var live []Receipt
	for _, cl := range claimed[2:] {
		live = append(live, cl.Receipt())
	}
	rec.reset()
	stale, err := c.AcknowledgeBatch(ctx, live)
	if err != nil || len(stale) != 0 {
		t.Fatalf("ack of live receipts: stale %v, %v", stale, err)
	}
	if got := rec.texts(); len(got) != 1 || !strings.HasPrefix(got[0], "UPDATE") {
		t.Fatalf("ack of 98 live receipts ran %d statements, want one UPDATE: %q", len(got), got)
	}
	for _, r := range live {
		if s := status(r.ID); s != StatusDelivered {
			t.Fatalf("row %d: %s after its ack", r.ID, s)
		}
	}

	// The first two rows' receipts with their keys swapped: both stale,
	// nothing changed; so is a receipt already settled.
	a, b := claimed[0], claimed[1]
	swapped := []Receipt{{ID: a.ID, ClaimKey: b.ClaimKey}, {ID: b.ID, ClaimKey: a.ClaimKey}}
	stale, err = c.AcknowledgeBatch(ctx, swapped)
	if err != nil || len(stale) != 2 {
		t.Fatalf("ack of two receipts with each other's claim keys: stale %v, %v", stale, err)
	}
	if status(a.ID) != StatusProcessing || status(b.ID) != StatusProcessing {
		t.Fatal("a receipt holding another row's claim key settled a row")
	}
	if stale, err = c.AcknowledgeBatch(ctx, live[:1]); err != nil || len(stale) != 1 {
		t.Fatalf("second ack of a settled receipt: stale %v, %v", stale, err)
	}
	// One live receipt beside a stale one: the live one is settled (by
	// the locking read and its UPDATE), the stale one reported.
	stale, err = c.AcknowledgeBatch(ctx, []Receipt{a.Receipt(), live[1]})
	if err != nil || len(stale) != 1 || stale[0] != live[1] {
		t.Fatalf("ack of a live and a stale receipt: stale %v, %v", stale, err)
	}
	if status(a.ID) != StatusDelivered || status(b.ID) != StatusProcessing {
		t.Fatal("the live receipt beside a stale one was not settled alone")
	}
}

// A MySQL claim reads the due rows before its transaction: a poll that
// finds nothing is that one read. A claim that finds rows runs the due
// read, then in its transaction the locking read (which also returns the
// database clock the lease is measured from), the read of the events'
// content and the UPDATE: four statements, whose lease is the one stored.
func TestMySQLClaimStatements(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, rec, db := recordingMySQLCore(ctx, t)
	req := ClaimRequest{Stream: "s", Worker: "w", Limit: 10, Lease: time.Minute, MaxAttempts: 3}
	rec.reset()
	if claimed, err := c.Claim(ctx, req); err != nil || len(claimed) != 0 {
		t.Fatalf("claim of an empty stream: %v, %v", claimed, err)
	}
	if got := rec.texts(); len(got) != 1 || rec.began != 0 {
		t.Fatalf("an empty poll ran %d statements in %d transactions, want one statement and none: %q", len(got), rec.began, got)
	}
	execAll(ctx, t, db,
		`INSERT INTO millpond_events (created_at, stream, event_key, event_kind, content_hash, metadata, payload)
SELECT 0, 's', CONCAT('k', a.d), 'K', UNHEX(SHA2('', 256)), '{}', '{}' FROM `+digits+` a`,
		`INSERT INTO millpond_deliveries (event_id, stream, consumer_group, status, available_at)
SELECT id, 's', '', 'pending', 0 FROM millpond_events ORDER BY id`)
	rec.reset()
	before := time.Now()
	claimed, err := c.Claim(ctx, req)
	if err != nil || len(claimed) != 10 {
		t.Fatalf("claim: %d rows, %v", len(claimed), err)
	}
	if got := rec.texts(); len(got) != 4 || rec.began != 1 {
		t.Fatalf("a claim ran %d statements in %d transactions, want 4 in one: %q", len(got), rec.began, got)
	}
	for _, cl := range claimed {
		var stored int64
		if err := db.QueryRowContext(ctx, "SELECT available_at FROM millpond_deliveries WHERE id = ?", cl.ID).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		if stored != cl.LeaseExpiresAt.UnixMicro() {
			t.Fatalf("row %d: lease stored until %d, returned until %d", cl.ID, stored, cl.LeaseExpiresAt.UnixMicro())
		}
		// The database clock, not the zero value: within a minute and a
		// few seconds of the claim, however the clocks differ a little.
		if d := cl.LeaseExpiresAt.Sub(before); d < 50*time.Second || d > 70*time.Second {
			t.Fatalf("row %d: lease expires %v after the claim, want about a minute", cl.ID, d)
		}
	}
}

// recordingDB records the statements run through it and its transactions,
// and counts the transactions it began (BEGIN and COMMIT are not counted
// as statements).
type recordingDB struct {
	DB
	mu    sync.Mutex
	got   []string
	began int
}

func (r *recordingDB) note(q string) {
	r.mu.Lock()
	r.got = append(r.got, q)
	r.mu.Unlock()
}

func (r *recordingDB) reset() { r.mu.Lock(); r.got, r.began = nil, 0; r.mu.Unlock() }

func (r *recordingDB) texts() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.got...)
}

func (r *recordingDB) ExecContext(ctx context.Context, q string, args ...any) (Result, error) {
	r.note(q)
	return r.DB.ExecContext(ctx, q, args...)
}

func (r *recordingDB) QueryContext(ctx context.Context, q string, args ...any) (Rows, error) {
	r.note(q)
	return r.DB.QueryContext(ctx, q, args...)
}

func (r *recordingDB) BeginTx(ctx context.Context, opts *sql.TxOptions) (Tx, error) {
	r.mu.Lock()
	r.began++
	r.mu.Unlock()
	tx, err := r.DB.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return recordingTx{Tx: tx, r: r}, nil
}

type recordingTx struct {
	Tx
	r *recordingDB
}

func (t recordingTx) ExecContext(ctx context.Context, q string, args ...any) (Result, error) {
	t.r.note(q)
	return t.Tx.ExecContext(ctx, q, args...)
}

func (t recordingTx) QueryContext(ctx context.Context, q string, args ...any) (Rows, error) {
	t.r.note(q)
	return t.Tx.QueryContext(ctx, q, args...)
}

// recordingMySQLCore is a MySQL core over a fresh plan-test database whose
// statements rec records.
func recordingMySQLCore(ctx context.Context, t *testing.T) (*Core, *recordingDB, *sql.DB) {
	t.Helper()
	_, db := mysqlPlanCore(ctx, t)
	rec := &recordingDB{DB: stdDB{db}}
	c, err := New(MySQL, rec)
	if err != nil {
		t.Fatal(err)
	}
	return c, rec, db
}
