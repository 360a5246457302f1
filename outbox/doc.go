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
// Watermill: a team moving handlers from another Watermill Pub/Sub (such
// as watermill-sql) onto the Publisher and Subscriber should know where
// they differ (watermill_adoption_test.go holds each point):
//
//   - A topic is a stream: 1-128 characters of [A-Za-z0-9._:-]. Publish,
//     Subscribe (so Router.Run) and SubscribeInitialize refuse others with
//     ErrInvalidKey.
//   - A named ConsumerGroup registers when it subscribes, which for a
//     router is Router.Run: events published before go only to the groups
//     registered then, or to the default group "", never to it. Call
//     SubscribeInitialize before publishing (at deployment) for a group
//     that must see them. Handlers sharing one Subscriber share its group
//     and split the events; give each handler that must get every event a
//     Subscriber of its own group.
//   - A Nack (a handler's error, a panic turned into one by Recoverer) is
//     retried after the Subscriber's Backoff (1 s, doubling) as the next
//     attempt (MetadataAttempt), and dead-lettered at MaxAttempts (10):
//     not redelivered at once and for ever. RecordHandlerError, outside
//     Recoverer, keeps the error text as the last error.
//   - middleware.Retry runs the handler again within one delivery: all its
//     runs count one attempt, and the lease is extended while it waits,
//     so a handler may run MaxAttempts × (MaxRetries+1) times in all.
//   - middleware.PoisonQueue acks the failed message, so it is never
//     retried or dead-lettered here. Give it NewAutoCommitPublisher (a
//     delivered message's context holds no transaction for
//     NewContextPublisher), and put it inside middleware.Timeout, not
//     outside: Timeout cancels the message's context when the handler
//     inside it returns, and Publish uses that context. The poisoned
//     message keeps its UUID (the event key) and metadata, its ordering key
//     among them, which orders it in the poison stream; poisoned again
//     after a redelivery, it is the same event, not a second one.
//   - A message's context keeps the Subscribe context's values (the
//     router's handler name) but not its cancellation: Router.Close lets
//     running handlers finish and writes their acks, for the Subscriber's
//     CloseTimeout (30 s); then their contexts are cancelled and their
//     events are delivered again after their lease. It is cancelled too
//     once the message is acked or nacked.
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
