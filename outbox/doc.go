// Package outbox is millpond's public API: a durable transactional outbox in
// the application's own database, and a Watermill Publisher and Subscriber
// over it.
//
// An application records an event in the same transaction as its data
// (Store.Enqueue or Publisher.Publish); either both commit or neither does.
// Workers claim due events under a time-limited lease (Store.Claim or the
// Subscriber), then acknowledge them (delivered) or fail them (retry after a
// delay, or dead-letter at the attempt limit). A claim is proven by an
// unguessable claim key: a worker whose lease expired, or that presents a
// wrong key, changes nothing and is told so with ErrStaleClaim.
//
// Dialects: PostgreSQL through pgx/v5 (with LISTEN/NOTIFY wake-ups), MySQL 8
// and MariaDB 10.6+ through go-sql-driver/mysql, and SQLite through
// modernc.org/sqlite, the embedded default. Each has its own package that
// opens a Store: outbox/postgres, outbox/mysql and outbox/sqlite; a program
// links only the drivers it imports. outbox/anydb opens any address and
// links all three.
//
// Consumer groups: each delivery row belongs to one consumer group. A group
// is registered durably (RegisterGroup, or by a Subscriber when it
// subscribes); every event enqueued after that gets a row for the group. A
// group that subscribes later sees only events enqueued after it registered,
// the way a new Google Pub/Sub subscription does. Events enqueued to a stream
// that has no registered group at all go to the default group "" so that
// nothing is dropped before the first subscriber exists.
//
// Telemetry: the store records OpenTelemetry metrics (millpond.* counters,
// histograms and backlog gauges, the gauges fed by one cached Stats query
// per interval, see CachedStats) and traces (a producer span per enqueue
// whose W3C trace context travels in the event's metadata, and a consumer
// span per handling by a Subscriber, its child) through the providers
// given with WithMeterProvider, WithTracerProvider and WithPropagator, the
// global ones by default. Ping and ListenerStatus serve readiness checks.
// docs/architecture.md lists every instrument, span and attribute.
package outbox
