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
		`CREATE TABLE IF NOT EXISTS cancellations (
			order_id     VARCHAR(64) PRIMARY KEY,
			prior_status VARCHAR(16) NOT NULL,
			created_at   TIMESTAMPTZ NOT NULL
		)`,
		`CREATE TABLE IF NOT EXISTS releases (
			order_id   VARCHAR(64) PRIMARY KEY,
			sku        VARCHAR(64) NOT NULL,
			qty        INTEGER     NOT NULL,
			created_at TIMESTAMPTZ NOT NULL
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
		`CREATE TABLE IF NOT EXISTS cancellations (
			order_id     VARCHAR(64) NOT NULL PRIMARY KEY,
			prior_status VARCHAR(16) NOT NULL,
			created_at   DATETIME(6) NOT NULL
		)`,
		`CREATE TABLE IF NOT EXISTS releases (
			order_id   VARCHAR(64) NOT NULL PRIMARY KEY,
			sku        VARCHAR(64) NOT NULL,
			qty        INT         NOT NULL,
			created_at DATETIME(6) NOT NULL
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
		`CREATE TABLE IF NOT EXISTS cancellations (
			order_id     TEXT      NOT NULL PRIMARY KEY,
			prior_status TEXT      NOT NULL,
			created_at   TIMESTAMP NOT NULL
		)`,
		`CREATE TABLE IF NOT EXISTS releases (
			order_id   TEXT      NOT NULL PRIMARY KEY,
			sku        TEXT      NOT NULL,
			qty        INTEGER   NOT NULL,
			created_at TIMESTAMP NOT NULL
		)`,
	},
}

// Errors of the domain that the HTTP API maps to client errors.
var (
	// ErrUnknownSKU reports an order for a product the shop does not stock.
	ErrUnknownSKU = errors.New("unknown sku")
	// ErrOrderNotFound reports an order id that does not exist.
	ErrOrderNotFound = errors.New("order not found")
	// ErrAlreadyCancelled reports a cancellation of a cancelled order.
	ErrAlreadyCancelled = errors.New("order already cancelled")
	// ErrOrderRejected reports a cancellation of a rejected order: it holds
	// no stock and is final.
	ErrOrderRejected = errors.New("order was rejected; there is nothing to cancel")
	// ErrOutOfOrder reports an event of an order handled before an event
	// that precedes it (a cancellation before the order's reservation, a
	// read-model change before the order's row): what the ordering key
	// rules out. No retry fixes it; the handlers dead-letter the event.
	ErrOutOfOrder = errors.New("event handled out of order")
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
	d := &Domain{dialect: store.Dialect(), store: store, publisher: publisher, log: log.Named("domain")}
	if _, ok := schema[d.dialect]; !ok {
		return nil, fmt.Errorf("orders: no schema for dialect %q", d.dialect)
	}
	lc.Append(fx.Hook{OnStart: func(ctx context.Context) error {
		// The store opens in its own start hook, which runs before this
		// one: SQLDB here, not in the constructor (where it would open the
		// store while fx.New may still fail, and nothing would close it).
		d.db = store.SQLDB()
		d.limitSQLite()
		return d.Migrate(ctx)
	}})
	return d, nil
}

// limitSQLite gives an SQLite store one connection.
func (d *Domain) limitSQLite() {
	if d.dialect == "sqlite" {
		// SQLite has one writer. With a connection per writer, writers wait
		// for its lock in SQLite's busy handler, which polls (sleeping up to
		// 100 ms between tries) and is not first come, first served: under
		// load one writer can lose the race for seconds, a lease extension
		// past the lease (the handler's acknowledgement is then stale) or any
		// transaction past the 10 s busy timeout ("database is locked").
		// One connection for the store and the service makes them wait in
		// database/sql's pool instead, and never in SQLite.
		d.db.SetMaxOpenConns(1)
	}
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
// and returns the event as recorded. The event's ordering key is the order
// id, as for every event of the order.
func (d *Domain) PlaceOrder(ctx context.Context, customer, sku string, qty int) (OrderPlaced, error) {
	var known int
	if err := d.db.QueryRowContext(ctx, d.q("SELECT COUNT(*) FROM stock WHERE sku = ?"), sku).Scan(&known); err != nil {
		return OrderPlaced{}, fmt.Errorf("orders: look up sku: %w", err)
	}
	if known == 0 {
		return OrderPlaced{}, fmt.Errorf("%w %q", ErrUnknownSKU, sku)
	}
	ev := OrderPlaced{OrderID: uuid.NewString(), Customer: customer, SKU: sku, Qty: qty, PlacedAt: now()}

	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return OrderPlaced{}, fmt.Errorf("orders: place order: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit

	if _, err := tx.ExecContext(ctx, d.q("INSERT INTO orders (id, customer, sku, qty, status, created_at) VALUES (?, ?, ?, ?, ?, ?)"),
		ev.OrderID, ev.Customer, ev.SKU, ev.Qty, StatusPlaced, ev.PlacedAt); err != nil {
		return OrderPlaced{}, fmt.Errorf("orders: insert order: %w", err)
	}
	if err := d.publish(ctx, tx, KindOrderPlaced, ev.OrderID, ev); err != nil {
		return OrderPlaced{}, fmt.Errorf("orders: place order: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return OrderPlaced{}, fmt.Errorf("orders: place order: commit: %w", err)
	}
	return ev, nil
}

// publish records an event of the HTTP API through the Watermill publisher,
// in tx: the message UUID is the idempotency key, and the metadata carry
// the kind and the ordering key (the order id).
func (d *Domain) publish(ctx context.Context, tx *sql.Tx, kind, orderID string, event any) error {
	payload, err := json.Marshal(event)
	if err != nil {
		return fmt.Errorf("encode %s: %w", kind, err)
	}
	msg := message.NewMessage(kind+":"+orderID, payload)
	msg.Metadata.Set(outbox.MetadataKind, kind)
	msg.Metadata.Set(outbox.MetadataOrderingKey, orderID)
	msg.SetContext(outbox.ContextWithTx(ctx, outbox.SQLTx(tx)))
	if err := d.publisher.Publish(Stream, msg); err != nil {
		return fmt.Errorf("publish %s: %w", kind, err)
	}
	return nil
}

// CancelOrder cancels an order: in one transaction, under the order's row
// lock, it inserts the cancellation and records OrderCancelled (ordering
// key: the order id). An order still placed (its reservation not decided
// yet) or reserved can be cancelled; a cancelled one is ErrAlreadyCancelled,
// a rejected one ErrOrderRejected, an unknown one ErrOrderNotFound. It
// returns the event and the order's status when it was cancelled.
//
// The stock goes back later, in the reserve-stock group's handling of the
// event, which comes after its handling of the order's OrderPlaced (see the
// package documentation).
func (d *Domain) CancelOrder(ctx context.Context, orderID string) (OrderCancelled, string, error) {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return OrderCancelled{}, "", fmt.Errorf("orders: cancel order: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()

	// The row lock serialises the cancellation with other cancellations and
	// with the reservation's decision, which takes the same lock first.
	var status string
	err = tx.QueryRowContext(ctx, d.q("SELECT status FROM orders WHERE id = ?"+d.forUpdate()), orderID).Scan(&status)
	if errors.Is(err, sql.ErrNoRows) {
		return OrderCancelled{}, "", ErrOrderNotFound
	}
	if err != nil {
		return OrderCancelled{}, "", fmt.Errorf("orders: cancel order: read order: %w", err)
	}
	var cancelled int
	if err := tx.QueryRowContext(ctx, d.q("SELECT COUNT(*) FROM cancellations WHERE order_id = ?"), orderID).Scan(&cancelled); err != nil {
		return OrderCancelled{}, "", fmt.Errorf("orders: cancel order: read cancellation: %w", err)
	}
	if cancelled > 0 {
		return OrderCancelled{}, "", ErrAlreadyCancelled
	}
	if status == StatusRejected {
		return OrderCancelled{}, "", ErrOrderRejected
	}
	ev := OrderCancelled{OrderID: orderID, CancelledAt: now()}
	res, err := tx.ExecContext(ctx, d.insertIgnore("cancellations", "order_id, prior_status, created_at", "?, ?, ?", "order_id"), orderID, status, ev.CancelledAt)
	if err != nil {
		return OrderCancelled{}, "", fmt.Errorf("orders: insert cancellation: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return OrderCancelled{}, "", fmt.Errorf("orders: insert cancellation: %w", err)
	} else if n == 0 {
		return OrderCancelled{}, "", ErrAlreadyCancelled // the unique key, should the lock not have told
	}
	if err := d.publish(ctx, tx, KindOrderCancelled, orderID, ev); err != nil {
		return OrderCancelled{}, "", fmt.Errorf("orders: cancel order: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return OrderCancelled{}, "", fmt.Errorf("orders: cancel order: commit: %w", err)
	}
	return ev, status, nil
}

// ackFunc acknowledges the delivery being handled inside the handler's
// transaction (handlers.Meta.AcknowledgeInTx), so that the handler's
// writes and the acknowledgement commit together: exactly-once effects.
type ackFunc func(ctx context.Context, tx *sql.Tx) error

// enqueue records a follow-up event in the handler's transaction, with the
// order id as its ordering key.
func (d *Domain) enqueue(ctx context.Context, tx *sql.Tx, kind, orderID string, event any) error {
	payload, err := json.Marshal(event)
	if err != nil {
		return fmt.Errorf("encode %s: %w", kind, err)
	}
	_, err = d.store.Enqueue(ctx, outbox.SQLTx(tx), outbox.Event{
		Stream: Stream, Key: kind + ":" + orderID, Kind: kind, Payload: payload, OrderingKey: orderID,
	})
	if err != nil {
		return fmt.Errorf("enqueue %s: %w", kind, err)
	}
	return nil
}

// Reserve decides an order: if it is still placed, it either takes the
// stock and inserts the reservation, or marks the order rejected, and
// records OrderReserved or OrderRejected, all in one transaction with the
// delivery's acknowledgement (ack). It does not look at a cancellation:
// a cancelled order is reserved like any other and its OrderCancelled,
// handled next in the same consumer group, gives the stock back. An order
// already decided (which the acknowledgement in the transaction rules out)
// is left as it is.
func (d *Domain) Reserve(ctx context.Context, orderID string, ack ackFunc) (decided string, err error) {
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
		return "", d.ackAndCommit(ctx, tx, ack, "reserve "+orderID) // decided by an earlier delivery
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
		if _, err := tx.ExecContext(ctx, d.q("INSERT INTO reservations (order_id, sku, qty, created_at) VALUES (?, ?, ?, ?)"), orderID, sku, qty, now()); err != nil {
			return "", fmt.Errorf("reserve %s: insert reservation: %w", orderID, err)
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
	if err := d.ackAndCommit(ctx, tx, ack, "reserve "+orderID); err != nil {
		return "", err
	}
	return decided, nil
}

// Release handles a cancellation: the order's reservation, if it has one,
// goes back to stock, the release is recorded in releases and StockReleased
// in the outbox, all in one transaction with the delivery's
// acknowledgement (ack). It relies on the order of handling: the order's
// reservation was decided before (its OrderPlaced came first in the same
// consumer group); an order still placed is ErrOutOfOrder. It returns the
// quantity released, and released false for a cancellation already handled
// (which the acknowledgement in the transaction rules out).
func (d *Domain) Release(ctx context.Context, orderID string, ack ackFunc) (qty int, released bool, err error) {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, false, fmt.Errorf("release %s: begin: %w", orderID, err)
	}
	defer func() { _ = tx.Rollback() }()

	var status, sku string
	err = tx.QueryRowContext(ctx, d.q("SELECT status, sku FROM orders WHERE id = ?"+d.forUpdate()), orderID).Scan(&status, &sku)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, fmt.Errorf("release %s: %w", orderID, ErrOrderNotFound)
	}
	if err != nil {
		return 0, false, fmt.Errorf("release %s: read order: %w", orderID, err)
	}
	if status == StatusPlaced {
		return 0, false, fmt.Errorf("release %s: the order's reservation is not decided yet: %w", orderID, ErrOutOfOrder)
	}
	if status == StatusReserved {
		err = tx.QueryRowContext(ctx, d.q("SELECT qty FROM reservations WHERE order_id = ?"), orderID).Scan(&qty)
		if err != nil {
			return 0, false, fmt.Errorf("release %s: read reservation: %w", orderID, err)
		}
	}
	// One release per order: the primary key makes a second one a no-op.
	res, err := tx.ExecContext(ctx, d.insertIgnore("releases", "order_id, sku, qty, created_at", "?, ?, ?, ?", "order_id"), orderID, sku, qty, now())
	if err != nil {
		return 0, false, fmt.Errorf("release %s: insert release: %w", orderID, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return 0, false, fmt.Errorf("release %s: insert release: %w", orderID, err)
	} else if n == 0 {
		return 0, false, d.ackAndCommit(ctx, tx, ack, "release "+orderID) // released by an earlier delivery
	}
	if qty > 0 {
		if _, err := tx.ExecContext(ctx, d.q("UPDATE stock SET available = available + ? WHERE sku = ?"), qty, sku); err != nil {
			return 0, false, fmt.Errorf("release %s: return stock: %w", orderID, err)
		}
	}
	if err := d.enqueue(ctx, tx, KindStockReleased, orderID, StockReleased{OrderID: orderID, SKU: sku, Qty: qty}); err != nil {
		return 0, false, fmt.Errorf("release %s: %w", orderID, err)
	}
	if err := d.ackAndCommit(ctx, tx, ack, "release "+orderID); err != nil {
		return 0, false, err
	}
	return qty, true, nil
}

// ackAndCommit acknowledges the delivery in tx (when ack is not nil) and
// commits.
func (d *Domain) ackAndCommit(ctx context.Context, tx *sql.Tx, ack ackFunc, what string) error {
	if ack != nil {
		if err := ack(ctx, tx); err != nil {
			return fmt.Errorf("%s: acknowledge: %w", what, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("%s: commit: %w", what, err)
	}
	return nil
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

// viewUpdates are the read model's statements, one per event kind of the
// read-model group. That group takes every kind the read model shows and
// gets an order's events one at a time in commit order, which is the
// order's history: OrderPlaced first, then OrderReserved or OrderRejected,
// then StockReleased if it was cancelled, with CustomerNotified anywhere
// after OrderPlaced. So each event is a plain update of the state the
// previous one left (no merge that would tolerate another order or a
// repeat: the acknowledgement commits with the update). The WHERE clause
// states the state the event must find; finding another is ErrOutOfOrder.
// Every kind the read model shows is in that group, so none of the former
// order-insensitive merges is left. CustomerNotified, recorded by notify
// (a group of its own), commits at any point after OrderPlaced, before or
// after the reservation's events; its update touches only its own column,
// so where it falls among them does not matter.
var viewUpdates = map[string]string{
	KindOrderPlaced:      "INSERT INTO order_view (order_id, status, reserved, notified, updated_at) VALUES (?, 'placed', FALSE, FALSE, ?)",
	KindOrderReserved:    "UPDATE order_view SET status = 'reserved', reserved = TRUE, updated_at = ? WHERE order_id = ? AND status = 'placed'",
	KindOrderRejected:    "UPDATE order_view SET status = 'rejected', updated_at = ? WHERE order_id = ? AND status = 'placed'",
	KindStockReleased:    "UPDATE order_view SET status = 'cancelled', reserved = FALSE, updated_at = ? WHERE order_id = ? AND status IN ('reserved', 'rejected')",
	KindCustomerNotified: "UPDATE order_view SET notified = TRUE, updated_at = ? WHERE order_id = ? AND NOT notified",
}

// ViewKinds are the event kinds the read model is built from.
var ViewKinds = []string{KindOrderPlaced, KindOrderReserved, KindOrderRejected, KindStockReleased, KindCustomerNotified}

// UpdateView applies an event of the order to order_view, in one
// transaction with the delivery's acknowledgement (ack).
func (d *Domain) UpdateView(ctx context.Context, kind, orderID string, ack ackFunc) error {
	stmt, ok := viewUpdates[kind]
	if !ok {
		return fmt.Errorf("update order_view of %s: no update for kind %q", orderID, kind)
	}
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("update order_view of %s: begin: %w", orderID, err)
	}
	defer func() { _ = tx.Rollback() }()
	args := []any{now(), orderID}
	if kind == KindOrderPlaced {
		args = []any{orderID, now()}
	}
	res, err := tx.ExecContext(ctx, d.q(stmt), args...)
	if err != nil {
		return fmt.Errorf("update order_view of %s on %s: %w", orderID, kind, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("update order_view of %s on %s: %w", orderID, kind, err)
	}
	if n != 1 {
		// Every statement changes a column of the row it matches, so MySQL's
		// count of changed rows is the count of matched rows too.
		return fmt.Errorf("update order_view of %s on %s: the order is not in the state this event follows: %w", orderID, kind, ErrOutOfOrder)
	}
	return d.ackAndCommit(ctx, tx, ack, "update order_view of "+orderID)
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
	// Status is placed, reserved, rejected or cancelled, from the read
	// model.
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
