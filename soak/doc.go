// Package soak holds idemq's crash soak, a test only: three relays and a
// Kafka and a JetStream consumer run as real OS processes (the test binary
// re-executing itself) and are SIGKILLed at random moments and restarted,
// while their Postgres connections are terminated at random
// (pg_terminate_backend) and the producer re-sends messages the relays
// already published.
//
// At the end each consumer must have applied every message exactly once
// (its effects table, one row per application, against the producer's
// count), the outbox must be empty without dead letters, the Kafka
// consumer must have applied each key's messages in order, and the
// JetStream stream, read back, must hold every message with each key's
// messages first appearing in order. (A JetStream consumer may apply a key
// out of order after a crash: the message it held unacknowledged comes back
// only after AckWait, behind newer ones, and so does a batch whose
// connection was terminated; the inbox still applies each once.)
//
// `go test ./soak` runs a short soak (3,000 messages per broker);
// `make soak` runs 100,000 (IDEMQ_SOAK_MESSAGES sets the size).
package soak
