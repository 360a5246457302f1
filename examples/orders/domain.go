package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"go.uber.org/fx"
	"go.uber.org/zap"

	"github.com/millpond/millpond/outbox"
)

// seedStock is the stock put in place on first start. "gizmo" is scarce on
// purpose, so that some orders are rejected.
var seedStock = []struct {
	SKU       string
	Available int
}{
	{"widget", 100000},
	{"gadget", 100000},
	{"gizmo", 60},
}

// schema holds the domain tables per dialect. Every statement is
// idempotent, so the whole list runs on every start.
var schema = map[string][]string{
	"postgres": {
		`CREATE TABLE IF NOT EXISTS orders (
			id         VARCHAR(64)  PRIMARY KEY,
			customer   VARCHAR(100) NOT NULL,
			sku        VARCHAR(64)  NOT NULL,
			qty        INTEGER      NOT NULL CHECK (qty > 0),
			status     VARCHAR(16)  NOT NULL,
			created_at TIMESTAMPTZ  NOT NULL
		)`,
		`CREATE TABLE IF NOT EXISTS stock (
			sku       VARCHAR(64) PRIMARY KEY,
			available INTEGER     NOT NULL CHECK (available >= 0)
		)`,
		`CREATE TABLE IF NOT EXISTS reservations (
			order_id   VARCHAR(64) NOT NULL UNIQUE,
			sku        VARCHAR(64) NOT NULL,
			qty        INTEGER     NOT NULL,
			created_at TIMESTAMPTZ NOT NULL
		)`,
		`CREATE TABLE IF NOT EXISTS notifications (
			order_id   VARCHAR(64) NOT NULL UNIQUE,
			text       TEXT        NOT NULL,
			created_at TIMESTAMPTZ NOT NULL
		)`,
		`CREATE TABLE IF NOT EXISTS order_view (
			order_id   VARCHAR(64) PRIMARY KEY,
			status     VARCHAR(16) NOT NULL,
			reserved   BOOLEAN     NOT NULL,
			notified   BOOLEAN     NOT NULL,
			updated_at TIMESTAMPTZ NOT NULL
		)`,
	},
	"mysql": {
		`CREATE TABLE IF NOT EXISTS orders (
			id         VARCHAR(64)  NOT NULL PRIMARY KEY,
			customer   VARCHAR(100) NOT NULL,
			sku        VARCHAR(64)  NOT NULL,
			qty        INT          NOT NULL CHECK (qty > 0),
			status     VARCHAR(16)  NOT NULL,
			created_at DATETIME(6)  NOT NULL
		)`,
		`CREATE TABLE IF NOT EXISTS stock (
			sku       VARCHAR(64) NOT NULL PRIMARY KEY,
			available INT         NOT NULL CHECK (available >= 0)
		)`,
		`CREATE TABLE IF NOT EXISTS reservations (
			order_id   VARCHAR(64) NOT NULL,
			sku        VARCHAR(64) NOT NULL,
			qty        INT         NOT NULL,
			created_at DATETIME(6) NOT NULL,
			UNIQUE KEY reservations_order_id (order_id)
		)`,
		`CREATE TABLE IF NOT EXISTS notifications (
			order_id   VARCHAR(64) NOT NULL,
			text       TEXT        NOT NULL,
			created_at DATETIME(6) NOT NULL,
			UNIQUE KEY notifications_order_id (order_id)
		)`,
		`CREATE TABLE IF NOT EXISTS order_view (
			order_id   VARCHAR(64) NOT NULL PRIMARY KEY,
			status     VARCHAR(16) NOT NULL,
			reserved   BOOLEAN     NOT NULL,
			notified   BOOLEAN     NOT NULL,
			updated_at DATETIME(6) NOT NULL
		)`,
	},
	"sqlite": {
		`CREATE TABLE IF NOT EXISTS orders (
			id         TEXT      NOT NULL PRIMARY KEY,
			customer   TEXT      NOT NULL,
			sku        TEXT      NOT NULL,
			qty        INTEGER   NOT NULL CHECK (qty > 0),
			status     TEXT      NOT NULL,
			created_at TIMESTAMP NOT NULL
		)`,
		`CREATE TABLE IF NOT EXISTS stock (
			sku       TEXT    NOT NULL PRIMARY KEY,
			available INTEGER NOT NULL CHECK (available >= 0)
		)`,
		`CREATE TABLE IF NOT EXISTS reservations (
			order_id   TEXT      NOT NULL UNIQUE,
			sku        TEXT      NOT NULL,
			qty        INTEGER   NOT NULL,
			created_at TIMESTAMP NOT NULL
		)`,
		`CREATE TABLE IF NOT EXISTS notifications (
			order_id   TEXT      NOT NULL UNIQUE,
			text       TEXT      NOT NULL,
			created_at TIMESTAMP NOT NULL
		)`,
		`CREATE TABLE IF NOT EXISTS order_view (
			order_id   TEXT      NOT NULL PRIMARY KEY,
			status     TEXT      NOT NULL,
			reserved   BOOLEAN   NOT NULL,
			notified   BOOLEAN   NOT NULL,
			updated_at TIMESTAMP NOT NULL
		)`,
	},
}

// Errors of the domain that the HTTP API maps to client errors.
var (
	// ErrUnknownSKU reports an order for a product the shop does not stock.
	ErrUnknownSKU = errors.New("unknown sku")
	// ErrOrderNotFound reports an order id that does not exist.
	ErrOrderNotFound = errors.New("order not found")
)

// Domain is the order service's data: its tables on the outbox store's own
// connections, and the outbox publisher its events go through.
type Domain struct {
	db        *sql.DB
	dialect   string
	store     *outbox.Store
	publisher *outbox.Publisher
	log       *zap.Logger
}

// newDomain returns the Domain over the store and migrates and seeds its
// tables on start, after the outbox schema (the store's start hook runs
// first) and before the bus starts handling (the handlers, and so the bus,
// depend on the Domain, so its hook is registered before theirs).
func newDomain(lc fx.Lifecycle, store *outbox.Store, publisher *outbox.Publisher, log *zap.Logger) (*Domain, error) {
	d := &Domain{db: store.SQLDB(), dialect: store.Dialect(), store: store, publisher: publisher, log: log.Named("domain")}
	if _, ok := schema[d.dialect]; !ok {
		return nil, fmt.Errorf("orders: no schema for dialect %q", d.dialect)
	}
	lc.Append(fx.Hook{OnStart: d.Migrate})
	return d, nil
}

// q rewrites a statement's ? placeholders for the dialect ($1, $2, ... on
// PostgreSQL). The statements of this package hold no other question marks.
func (d *Domain) q(query string) string {
	if d.dialect != "postgres" {
		return query
	}
	return rebindDollar(query)
}

func rebindDollar(query string) string {
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// forUpdate is the row-lock suffix of a locking read. SQLite has none and
// needs none: its transactions here begin immediate, holding the one write
// lock.
func (d *Domain) forUpdate() string {
	if d.dialect == "sqlite" {
		return ""
	}
	return " FOR UPDATE"
}

// insertIgnore returns an INSERT that does nothing when the row's unique key
// exists: INSERT IGNORE on MySQL, ON CONFLICT DO NOTHING elsewhere.
func (d *Domain) insertIgnore(table, columns, values, conflict string) string {
	if d.dialect == "mysql" {
		return d.q("INSERT IGNORE INTO " + table + " (" + columns + ") VALUES (" + values + ")")
	}
	return d.q("INSERT INTO " + table + " (" + columns + ") VALUES (" + values + ") ON CONFLICT (" + conflict + ") DO NOTHING")
}

// Migrate creates the domain tables and seeds the stock; both are
// idempotent.
func (d *Domain) Migrate(ctx context.Context) error {
	for i, stmt := range schema[d.dialect] {
		if _, err := d.db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("orders: migrate %s statement %d: %w", d.dialect, i+1, err)
		}
	}
	seeded := 0
	for _, s := range seedStock {
		res, err := d.db.ExecContext(ctx, d.insertIgnore("stock", "sku, available", "?, ?", "sku"), s.SKU, s.Available)
		if err != nil {
			return fmt.Errorf("orders: seed stock of %s: %w", s.SKU, err)
		}
		if n, err := res.RowsAffected(); err == nil && n > 0 {
			seeded++
		}
	}
	d.log.Info("domain schema ready", zap.String("dialect", d.dialect), zap.Int("skus_seeded", seeded))
	return nil
}

// Ping checks the database.
func (d *Domain) Ping(ctx context.Context) error {
	if err := d.db.PingContext(ctx); err != nil {
		return fmt.Errorf("orders: ping database: %w", err)
	}
	return nil
}

// now is the time written to the domain tables: UTC, in microseconds, the
// precision every dialect keeps.
func now() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }

// PlaceOrder inserts an order and its OrderPlaced event in one transaction
// and returns the event as recorded.
func (d *Domain) PlaceOrder(ctx context.Context, customer, sku string, qty int) (OrderPlaced, error) {
	var known int
	if err := d.db.QueryRowContext(ctx, d.q("SELECT COUNT(*) FROM stock WHERE sku = ?"), sku).Scan(&known); err != nil {
		return OrderPlaced{}, fmt.Errorf("orders: look up sku: %w", err)
	}
	if known == 0 {
		return OrderPlaced{}, fmt.Errorf("%w %q", ErrUnknownSKU, sku)
	}
	ev := OrderPlaced{OrderID: uuid.NewString(), Customer: customer, SKU: sku, Qty: qty, PlacedAt: now()}
	payload, err := json.Marshal(ev)
	if err != nil {
		return OrderPlaced{}, fmt.Errorf("orders: encode OrderPlaced: %w", err)
	}

	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return OrderPlaced{}, fmt.Errorf("orders: place order: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit

	if _, err := tx.ExecContext(ctx, d.q("INSERT INTO orders (id, customer, sku, qty, status, created_at) VALUES (?, ?, ?, ?, ?, ?)"),
		ev.OrderID, ev.Customer, ev.SKU, ev.Qty, StatusPlaced, ev.PlacedAt); err != nil {
		return OrderPlaced{}, fmt.Errorf("orders: insert order: %w", err)
	}
	// The event goes through the Watermill publisher, in this transaction.
	msg := message.NewMessage(KindOrderPlaced+":"+ev.OrderID, payload)
	msg.Metadata.Set(outbox.MetadataKind, KindOrderPlaced)
	msg.SetContext(outbox.ContextWithTx(ctx, outbox.SQLTx(tx)))
	if err := d.publisher.Publish(Stream, msg); err != nil {
		return OrderPlaced{}, fmt.Errorf("orders: publish OrderPlaced: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return OrderPlaced{}, fmt.Errorf("orders: place order: commit: %w", err)
	}
	return ev, nil
}

// enqueue records a follow-up event in the handler's transaction.
func (d *Domain) enqueue(ctx context.Context, tx *sql.Tx, kind, orderID string, event any) error {
	payload, err := json.Marshal(event)
	if err != nil {
		return fmt.Errorf("encode %s: %w", kind, err)
	}
	_, err = d.store.Enqueue(ctx, outbox.SQLTx(tx), outbox.Event{
		Stream: Stream, Key: kind + ":" + orderID, Kind: kind, Payload: payload,
	})
	if err != nil {
		return fmt.Errorf("enqueue %s: %w", kind, err)
	}
	return nil
}

// Reserve decides an order exactly once: if it is still placed, it either
// takes the stock and inserts the reservation, or marks the order rejected,
// and records OrderReserved or OrderRejected, all in one transaction. An
// order already decided (a redelivery) is left as it is.
func (d *Domain) Reserve(ctx context.Context, orderID string) (decided string, err error) {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return "", fmt.Errorf("reserve %s: begin: %w", orderID, err)
	}
	defer func() { _ = tx.Rollback() }()

	var status, sku string
	var qty int
	err = tx.QueryRowContext(ctx, d.q("SELECT status, sku, qty FROM orders WHERE id = ?"+d.forUpdate()), orderID).Scan(&status, &sku, &qty)
	if errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("reserve %s: %w", orderID, ErrOrderNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("reserve %s: read order: %w", orderID, err)
	}
	if status != StatusPlaced {
		return "", nil // decided by an earlier delivery
	}

	res, err := tx.ExecContext(ctx, d.q("UPDATE stock SET available = available - ? WHERE sku = ? AND available >= ?"), qty, sku, qty)
	if err != nil {
		return "", fmt.Errorf("reserve %s: take stock: %w", orderID, err)
	}
	taken, err := res.RowsAffected()
	if err != nil {
		return "", fmt.Errorf("reserve %s: take stock: %w", orderID, err)
	}
	if taken == 1 {
		res, err := tx.ExecContext(ctx, d.insertIgnore("reservations", "order_id, sku, qty, created_at", "?, ?, ?, ?", "order_id"), orderID, sku, qty, now())
		if err != nil {
			return "", fmt.Errorf("reserve %s: insert reservation: %w", orderID, err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return "", fmt.Errorf("reserve %s: insert reservation: %w", orderID, err)
		} else if n == 0 {
			// A reservation exists although the order was still placed:
			// keep the stock, change nothing.
			d.log.Warn("reservation already exists; not reserving twice", zap.String("order_id", orderID))
			return "", nil
		}
		decided = StatusReserved
		if err := d.enqueue(ctx, tx, KindOrderReserved, orderID, OrderReserved{OrderID: orderID, SKU: sku, Qty: qty}); err != nil {
			return "", fmt.Errorf("reserve %s: %w", orderID, err)
		}
	} else {
		decided = StatusRejected
		reason := fmt.Sprintf("not enough %s in stock for %d", sku, qty)
		if err := d.enqueue(ctx, tx, KindOrderRejected, orderID, OrderRejected{OrderID: orderID, Reason: reason}); err != nil {
			return "", fmt.Errorf("reserve %s: %w", orderID, err)
		}
	}
	if _, err := tx.ExecContext(ctx, d.q("UPDATE orders SET status = ? WHERE id = ?"), decided, orderID); err != nil {
		return "", fmt.Errorf("reserve %s: update order: %w", orderID, err)
	}
	if err := tx.Commit(); err != nil {
		return "", fmt.Errorf("reserve %s: commit: %w", orderID, err)
	}
	return decided, nil
}

// Notify inserts the order's notification once and records
// CustomerNotified with it. It reports whether this call inserted it.
func (d *Domain) Notify(ctx context.Context, ev OrderPlaced) (bool, error) {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("notify %s: begin: %w", ev.OrderID, err)
	}
	defer func() { _ = tx.Rollback() }()

	text := fmt.Sprintf("Hello %s, we received your order %s for %d x %s.", ev.Customer, ev.OrderID, ev.Qty, ev.SKU)
	res, err := tx.ExecContext(ctx, d.insertIgnore("notifications", "order_id, text, created_at", "?, ?, ?", "order_id"), ev.OrderID, text, now())
	if err != nil {
		return false, fmt.Errorf("notify %s: insert notification: %w", ev.OrderID, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("notify %s: insert notification: %w", ev.OrderID, err)
	}
	if n == 0 {
		return false, nil // notified by an earlier delivery, which recorded the event
	}
	if err := d.enqueue(ctx, tx, KindCustomerNotified, ev.OrderID, CustomerNotified{OrderID: ev.OrderID}); err != nil {
		return false, fmt.Errorf("notify %s: %w", ev.OrderID, err)
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("notify %s: commit: %w", ev.OrderID, err)
	}
	return true, nil
}

// viewChange is one fact the read model learns about an order.
type viewChange struct {
	status   string // StatusPlaced, or a final status
	reserved bool
	notified bool
}

// UpdateView merges a fact into order_view. The merge only moves forward
// (placed to a final status, false to true), so facts may arrive in any
// order and any number of times.
func (d *Domain) UpdateView(ctx context.Context, orderID string, c viewChange) error {
	var stmt string
	if d.dialect == "mysql" {
		stmt = `INSERT INTO order_view (order_id, status, reserved, notified, updated_at) VALUES (?, ?, ?, ?, ?)
			ON DUPLICATE KEY UPDATE
				status = IF(status = 'placed', VALUES(status), status),
				reserved = reserved OR VALUES(reserved),
				notified = notified OR VALUES(notified),
				updated_at = VALUES(updated_at)`
	} else {
		stmt = d.q(`INSERT INTO order_view (order_id, status, reserved, notified, updated_at) VALUES (?, ?, ?, ?, ?)
			ON CONFLICT (order_id) DO UPDATE SET
				status = CASE WHEN order_view.status = 'placed' THEN excluded.status ELSE order_view.status END,
				reserved = order_view.reserved OR excluded.reserved,
				notified = order_view.notified OR excluded.notified,
				updated_at = excluded.updated_at`)
	}
	if _, err := d.db.ExecContext(ctx, stmt, orderID, c.status, c.reserved, c.notified, now()); err != nil {
		return fmt.Errorf("update order_view of %s: %w", orderID, err)
	}
	return nil
}

// OrderView is an order as the API shows it: the order row with its state
// from the read model.
type OrderView struct {
	// ID identifies the order.
	ID string `json:"id"`
	// Customer is who placed it.
	Customer string `json:"customer"`
	// SKU is the product ordered.
	SKU string `json:"sku"`
	// Qty is how many.
	Qty int `json:"qty"`
	// Status is placed, reserved or rejected, from the read model.
	Status string `json:"status"`
	// Reserved tells whether stock is reserved for it.
	Reserved bool `json:"reserved"`
	// Notified tells whether the customer was notified.
	Notified bool `json:"notified"`
	// CreatedAt is when it was placed.
	CreatedAt time.Time `json:"created_at"`
	// UpdatedAt is when the read model last changed, nil before its first
	// update.
	UpdatedAt *time.Time `json:"updated_at,omitempty"`
}

// GetOrder returns an order joined with its read model.
func (d *Domain) GetOrder(ctx context.Context, id string) (OrderView, error) {
	var v OrderView
	var created dbTime
	var status sql.NullString
	var reserved, notified sql.NullBool
	var updated nullDBTime
	err := d.db.QueryRowContext(ctx, d.q(`SELECT o.id, o.customer, o.sku, o.qty, o.created_at, v.status, v.reserved, v.notified, v.updated_at
		FROM orders o LEFT JOIN order_view v ON v.order_id = o.id WHERE o.id = ?`), id).
		Scan(&v.ID, &v.Customer, &v.SKU, &v.Qty, &created, &status, &reserved, &notified, &updated)
	if errors.Is(err, sql.ErrNoRows) {
		return OrderView{}, ErrOrderNotFound
	}
	if err != nil {
		return OrderView{}, fmt.Errorf("orders: get order: %w", err)
	}
	v.CreatedAt = created.Time
	v.Status = StatusPlaced
	if status.Valid {
		v.Status = status.String
	}
	v.Reserved, v.Notified = reserved.Bool, notified.Bool
	if updated.Valid {
		v.UpdatedAt = &updated.Time
	}
	return v, nil
}

// StockLevel is the available quantity of one SKU.
type StockLevel struct {
	// SKU is the product.
	SKU string `json:"sku"`
	// Available is how many can still be reserved.
	Available int `json:"available"`
}

// Stock lists the stock of every SKU.
func (d *Domain) Stock(ctx context.Context) ([]StockLevel, error) {
	rows, err := d.db.QueryContext(ctx, "SELECT sku, available FROM stock ORDER BY sku")
	if err != nil {
		return nil, fmt.Errorf("orders: list stock: %w", err)
	}
	defer rows.Close()
	out := []StockLevel{}
	for rows.Next() {
		var s StockLevel
		if err := rows.Scan(&s.SKU, &s.Available); err != nil {
			return nil, fmt.Errorf("orders: list stock: %w", err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("orders: list stock: %w", err)
	}
	return out, nil
}

// dbTime scans a timestamp the way each driver returns it: time.Time (pgx,
// SQLite's TIMESTAMP columns, MySQL with parseTime=true) or text (MySQL
// without parseTime).
type dbTime struct{ time.Time }

var timeLayouts = []string{
	time.RFC3339Nano,
	"2006-01-02 15:04:05.999999999-07:00",
	"2006-01-02 15:04:05.999999999",
	"2006-01-02T15:04:05.999999999",
}

// Scan implements sql.Scanner.
func (t *dbTime) Scan(src any) error {
	switch v := src.(type) {
	case time.Time:
		t.Time = v.UTC()
		return nil
	case []byte:
		return t.parse(string(v))
	case string:
		return t.parse(v)
	default:
		return fmt.Errorf("scan timestamp: unsupported type %T", src)
	}
}

func (t *dbTime) parse(s string) error {
	for _, layout := range timeLayouts {
		if p, err := time.Parse(layout, s); err == nil {
			t.Time = p.UTC()
			return nil
		}
	}
	return fmt.Errorf("scan timestamp: unrecognised format %q", s)
}

// nullDBTime is a dbTime that may be NULL.
type nullDBTime struct {
	dbTime
	Valid bool
}

// Scan implements sql.Scanner.
func (t *nullDBTime) Scan(src any) error {
	if src == nil {
		t.Valid = false
		return nil
	}
	t.Valid = true
	return t.dbTime.Scan(src)
}
