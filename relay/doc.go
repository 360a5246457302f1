// Package relay forwards outbox events to a message broker: to NATS
// JetStream exactly once per event and in per-key order (JetStream), or to
// any Watermill message.Publisher at least once (Watermill).
//
// A relay is a consumer group of the outbox (DefaultGroup unless
// configured): it claims events in batches (up to Config.BatchSize at once,
// the next claim overlapping the publishing of the previous batch),
// publishes each one asynchronously and acknowledges the outbox row only
// once the broker confirmed it (JetStream's PubAck, or the Watermill
// publisher's return). Events of one ordering key are published one after
// another, because the outbox hands a consumer group at most one unsettled
// event per key; events of different keys go out in parallel, up to
// Config.Window publishes unconfirmed. A failed publish goes to Store.Fail
// with the relay's backoff (dead letter at Config.MaxAttempts).
//
// On PostgreSQL a relay holds each claimed batch in a transaction
// (outbox.Store.ClaimHeld) until every event of it has an outcome, then
// settles the batch in that transaction: a published event's row is
// written once, not at the claim and again at its acknowledgement (about
// half the database's work per event), and the events of a relay that dies
// are due again at once. Elsewhere, or with Config.UseLeases, it claims
// under leases (outbox.Store.Claim), extended every Lease/3 until an event
// is settled, and writes every acknowledgement waiting in one
// Store.AcknowledgeBatch.
//
// # Exactly once into JetStream
//
// A relay that crashes after JetStream stored an event but before the
// outbox row was acknowledged publishes the event again once its lease
// expires (held claims: once the database ends its session). Every message carries Nats-Msg-Id = MsgID(stream, key), so
// JetStream drops the second copy when it arrives within the stream's
// duplicate window, and answers with a PubAck marked Duplicate, which the
// relay counts as success. The window must be at least
// Config.RequiredDuplicateWindow (the lease, or with held claims the
// longest a held batch may stay open, + longest retry delay + publish
// timeout); New refuses a stream with a shorter one
// (ErrDuplicateWindowTooShort).
//
// Strict mode (JetStreamConfig.Strict) needs no window: each message is
// published with Nats-Expected-Last-Subject-Sequence, the sequence of the
// subject's last message as the relay knows it. On a mismatch the relay reads the
// subject's last message: if it carries this event's Nats-Msg-Id the event
// was already published (success); if it is an earlier event of the same
// ordering key the relay publishes again against its sequence; anything
// else is ErrStrictConflict. That needs a subject per ordering key (the
// template must hold {stream} and {ordering_key}) written only by this
// relay's consumer group, and the group's dead-letter policy is
// outbox.DeadLetterHold.
//
// # Subjects and headers
//
// Subjects come from a template (DefaultSubjectTemplate,
// "{prefix}.{stream}.{kind}"); stream, kind, key and ordering key are
// encoded as single tokens by EncodeToken ('.' becomes '~'). The payload is
// sent unchanged; headers carry the event's stream, kind, key, ordering key
// and sequence (HeaderStream and the others) and its metadata, the W3C
// trace context (traceparent, tracestate) included.
//
// # Metrics
//
// Both relays record OpenTelemetry metrics through Config.MeterProvider
// (the global one by default): millpond.relay.published, .duplicates,
// .failures (by AttrReason), .dead_lettered, .publish.latency (claim to
// confirmation), .delivery.latency (enqueue to confirmation) and .in_flight
// (the window in use). Their attributes are bounded: the outbox stream,
// the consumer group, AttrTarget, and AttrReason or outbox.AttrOutcome.
package relay
