// Command orders is millpond's example order service: a small HTTP API whose
// writes and events commit together through the transactional outbox, and
// whose side effects run in handlers on the in-process bus, each order's
// events in the order they happened (the order id is their ordering key).
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
//	curl -s -XPOST localhost:8080/orders/<id>/cancel
//	curl -s localhost:8080/stock
//	curl -s localhost:8080/stats
//
// Flags (all but -stats-interval also read from an environment variable; a
// flag wins):
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
//	                             let the admin UI at /admin/ requeue,
//	                             reroute and discard dead letters and
//	                             unregister groups (default: read-only)
//	-stats-interval              how long one backlog query serves /metrics
//	                             and /readyz (default 15s)
//
// For example, on the local PostgreSQL or MariaDB server:
//
//	go run ./examples/orders -db 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
//	go run ./examples/orders -db 'mysql://root@127.0.0.1:3306/test'
//
// On PostgreSQL the pool defaults to 20 connections, shared by the HTTP
// handlers and every event handler; add pool_max_conns=N to the URL for
// more. On SQLite the service uses one connection: SQLite has one writer,
// and writers waiting in SQLite's busy handler (which polls and is not
// first come, first served) can starve under load, up to "database is
// locked" after the busy timeout; in database/sql's pool they wait without
// a timeout, and the lock is never contended. Passwords in the address are never logged or printed.
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
// reservations (order_id unique), notifications (order_id unique),
// cancellations and releases (one row per order at most) and the read
// model order_view. Stock for a few SKUs is seeded once ("gizmo" is scarce
// on purpose, so some orders are rejected).
//
// POST /orders {"customer","sku","qty"} inserts the order and its
// OrderPlaced event in one transaction and answers 201 {"id": ...}; invalid
// input gets 400 with the reason, a body over 64 KiB 413. POST /orders/{id}/cancel inserts the
// cancellation and its OrderCancelled event in one transaction, under the
// order's row lock, and answers 200 {"id", "status": "cancelled",
// "previous_status", "cancelled_at"}: an order can be cancelled while it is
// placed (its reservation not decided yet) or reserved; an unknown id gets
// 404, an order already cancelled or rejected 409 with the reason. The
// stock comes back, and the read model says "cancelled", once the
// cancellation is handled. GET /orders/{id} returns the order with status
// (placed, reserved, rejected or cancelled), reserved and notified from the
// read model. GET /healthz, GET /readyz (the bus's readiness report, the
// groups below counted in), GET /metrics (Prometheus text), GET /stock and
// GET /stats (undelivered outbox rows per stream and group, blocked ones
// included) help operate it, and so does millpond's admin UI at
// http://localhost:8080/admin/ (package admin): the backlog per stream and
// group, dead letters and their payloads, event lookup. It is read-only
// unless -admin-actions is given, and it answers requests from the machine
// itself only (a real service would authenticate its operators in
// admin.Options.Authorize).
//
// # Events, ordering and consumer groups
//
// Every event of an order, on stream "orders", carries the order id as its
// ordering key (the Watermill metadata key outbox.MetadataOrderingKey on
// the HTTP API's publishes, outbox.Event.OrderingKey on the handlers'
// enqueues). Each consumer group then gets an order's events one at a
// time, in the order their transactions committed; different orders go in
// parallel. Order holds per consumer group, across the kinds that group
// takes, so the events that must be seen in order by one piece of code go
// to one group:
//
//   - reserve-stock (OrderPlaced, OrderCancelled): OrderPlaced decrements
//     the stock and inserts the reservation, or marks the order rejected
//     when stock is short, and records OrderReserved or OrderRejected.
//     OrderCancelled gives the reservation back to stock (once: the release
//     is a row of releases) and records StockReleased. A cancellation may
//     commit before the placement was handled (the customer cancels at
//     once); it still comes to this group after the placement's handling,
//     so the reservation it gives back exists. Reserve does not look at the
//     cancellation: the order of the events is what makes the stock exact.
//     An OrderCancelled that finds its order undecided could only come from
//     an event without its ordering key; it is dead-lettered
//     (ErrOutOfOrder), never applied.
//   - read-model (OrderPlaced, OrderReserved, OrderRejected, StockReleased,
//     CustomerNotified): one plain statement per kind on order_view:
//     insert it placed, then set reserved or rejected, then cancelled, and
//     set notified. The read model follows StockReleased rather than
//     OrderCancelled: an OrderCancelled may commit before the
//     OrderReserved of its order (the cancellation before the
//     reservation's handling), while StockReleased, recorded by
//     reserve-stock's handling of OrderCancelled, always commits after
//     OrderReserved or OrderRejected. Each statement states the state it
//     expects (reserved from placed, ...) and an event that finds another
//     is dead-lettered rather than applied.
//   - notify (OrderPlaced): inserts the customer's notification and records
//     CustomerNotified. It takes one kind and nothing else depends on its
//     order, so it is an ordinary bus handler (package handlers).
//
// A bus handler (handlers.New, fxmodule.AsHandler) is its own consumer
// group and takes one kind, so it cannot order OrderCancelled after
// OrderPlaced. The two groups above are therefore Watermill handlers of
// their own, added to the bus's router before it starts (see
// newOrderGroups): each reads an outbox.Subscriber whose
// SubscriberConfig.Kinds lists its kinds and switches on the event kind
// (the documented way to order several kinds, docs/architecture.md
// "Ordering keys"), decoding each payload into its type. On the bus's
// router they share its middleware (a handlers.Permanent error
// dead-letters the event at once), its start (the subscribers register
// their groups for their kinds before the bus's Start returns, so before
// the first order is accepted) and its graceful stop; the bus is told they
// are served (bus.Config.OtherGroups) and /readyz adds their subscribers
// and backlog to the bus's report. A union payload under one kind would
// also fit a single bus handler, but it would hide the kinds from the
// metrics, the admin UI and the other groups.
//
// Delivery is at least once. The two ordered groups acknowledge each
// delivery inside their own transaction (handlers.Meta.AcknowledgeInTx):
// their writes and the acknowledgement commit together or not at all, so
// each event has its effect exactly once, and an order's next event is
// handed out only once that transaction committed. Their checks of the
// order's state (reserve only a placed order, release once, the read
// model's expected states) catch what the acknowledgement rules out; the
// read model no longer merges facts that arrive in any order or twice.
// notify stays idempotent instead: the notification's unique order_id makes
// a second insert a no-op.
//
// A database used by an earlier version of this example has the read
// model's four groups of then (read-model.placed, read-model.reserved,
// read-model.rejected, read-model.notified): the service warns about them
// at start (bus.ErrUnservedGroup). Drain them first (run the earlier
// version until /stats shows no backlog), then retire them with
// "millpond groups unregister -stream orders -group read-model.placed" and
// so on; reserve-stock keeps its name and gains OrderCancelled.
package main
