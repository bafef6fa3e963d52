// Package idemq holds what every layer of idemq shares: the error markers
// that handlers and sinks return to steer retries.
//
// The packages below it build effectively-once processing on top of
// at-least-once brokers:
//
//   - inbox: the Postgres record of every message applied, claimed inside the
//     handler's transaction or under a fenced lease;
//   - consumer: the transport-agnostic core that deduplicates, retries and
//     dead-letters;
//   - outbox and relay: messages written in the business transaction and
//     published by a worker with backoff, dead letters and per-key order;
//   - transports/...: Kafka, NATS, HTTP and gRPC adapters.
//
// Errors: a handler or sink returns a plain error to ask for a retry with
// backoff, [Permanent] to give up at once, and [RetryAfter] to retry no
// sooner than a given delay. [ErrNotFound] and [ErrConflict] are the one
// "no record" and the one "key reused with another payload" of every
// store.
//
// Maintenance: the stores' chores (inbox GC and partitions, dead-letter
// classification, request-record GC) run in a [Maintenance] service,
// started with [Start] beside a consumer or a relay in every process;
// each chore runs in one process at a time.
package idemq
