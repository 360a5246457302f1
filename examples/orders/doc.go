// Command orders is millpond's example order service: a small HTTP API whose
// writes and events commit together through the transactional outbox, and
// whose side effects run in idempotent handlers on the in-process bus.
//
// # Running it
//
//	go run ./examples/orders
//
// serves http://localhost:8080 on an embedded SQLite database, orders.db in
// the working directory, created, migrated and seeded with stock on first
// start. Nothing else is needed. Try:
//
//	curl -s -XPOST localhost:8080/orders -d '{"customer":"ada","sku":"widget","qty":2}'
//	curl -s localhost:8080/orders/<id>
//	curl -s localhost:8080/stock
//	curl -s localhost:8080/stats
//
// Flags (each also read from an environment variable; a flag wins):
//
//	-addr  ORDERS_ADDR           listen address (default ":8080")
//	-db    ORDERS_DATABASE_URL   database: sqlite:path, a postgres:// or
//	                             mysql:// URL, or a PostgreSQL key=value
//	                             string (default "sqlite:orders.db"; an
//	                             address of any other form is an error)
//	-lease ORDERS_LEASE          outbox lease of each handler's claims
//	                             (default 30s, 1s-1h); a short lease makes a
//	                             crashed process's events come back sooner
//	-admin-actions ORDERS_ADMIN_ACTIONS=1
//	                             let the admin UI at /admin/ requeue and
//	                             reroute dead letters (default: read-only)
//
// For example, on the local PostgreSQL or MariaDB server:
//
//	go run ./examples/orders -db 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
//	go run ./examples/orders -db 'mysql://root@127.0.0.1:3306/test'
//
// On PostgreSQL the pool defaults to 20 connections, shared by the HTTP
// handlers and every event handler; add pool_max_conns=N to the URL for
// more. Passwords in the address are never logged or printed.
//
// ORDERS_HANDLER_DELAY (a duration such as 20ms; not a flag, and not for
// production) makes every handler sleep that long before its work. The
// end-to-end test uses it to kill the process while events are being
// handled.
//
// # What it does
//
// It is an fx application: fxmodule.Module provides the outbox Store, a
// Publisher and the Bus; the handlers join the bus through
// fxmodule.AsHandler; everything logs through one zap logger; the HTTP
// server starts and stops with the fx lifecycle (SIGINT or SIGTERM stop it
// gracefully).
//
// Domain tables, migrated on start after the outbox schema: orders, stock,
// reservations (order_id unique), notifications (order_id unique) and the
// read model order_view. Stock for a few SKUs is seeded once ("gizmo" is
// scarce on purpose, so some orders are rejected).
//
// POST /orders {"customer","sku","qty"} inserts the order and its
// OrderPlaced event in one transaction and answers 201 {"id": ...}; invalid
// input gets 400 with the reason. GET /orders/{id} returns the order with
// status, reserved and notified from the read model. GET /healthz, GET
// /stock and GET /stats (undelivered outbox rows per stream and group) help
// operate it, and so does millpond's admin UI at http://localhost:8080/admin/
// (package admin): the backlog per stream and group, dead letters and their
// payloads, event lookup. It is read-only unless -admin-actions is given, and
// it answers requests from the machine itself only (a real service would
// authenticate its operators in admin.Options.Authorize).
//
// Handlers, each its own consumer group on stream "orders":
//
//   - reserve-stock (OrderPlaced): in one transaction, decrements the stock
//     and inserts the reservation, or marks the order rejected when stock is
//     short, and records OrderReserved or OrderRejected in the outbox.
//   - notify (OrderPlaced): inserts the customer's notification and records
//     CustomerNotified.
//   - read-model.placed, read-model.reserved, read-model.rejected,
//     read-model.notified: upsert order_view (placed, then reserved or
//     rejected, and notified).
//
// Delivery is at least once (a crash after the work but before the
// acknowledgement delivers the event again), so every handler is
// idempotent: reserve-stock acts only on an order still "placed", under a
// row lock, and the unique order_id of reservations and notifications makes
// a second insert a no-op; the read model's upserts only move forward
// (placed to a final status, notified false to true), so they commute and
// may be repeated.
package main
