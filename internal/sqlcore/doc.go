// Package sqlcore owns the durable outbox table: its schema and migrations for
// each dialect, every SQL statement, the state machine of a row, the clock and
// the bounds on every input.
//
// A row is one delivery of one event to one consumer group:
//
//	pending --claim--> processing --ack--> delivered
//	   ^                   |
//	   +------fail---------+--fail at limit / lease expired at limit--> dead_letter
//
// A processing row whose lease has expired is claimable again. Every state
// change that belongs to a claim requires the exact claim key of that claim
// while its lease holds, so a stale worker changes nothing.
//
// Times are stored as BIGINT microseconds since the Unix epoch and, unless a
// clock is injected for tests, are read from the database's own clock, so
// clock skew between application hosts cannot steal a lease early.
//
// The package knows nothing of Watermill or fx; callers hand it an Executor
// (an open transaction) or a DB (a pool that can begin transactions).
package sqlcore
