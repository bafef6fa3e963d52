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
// sooner than a given delay.
package idemq
