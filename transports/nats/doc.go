// Package nats connects idemq to NATS through nats.go: JetStream (the
// jetstream package) and core NATS.
//
// # Outbound
//
// [JetStreamSink] is a relay.Sink publishing outbox rows to JetStream with
// the outbox message id in the Nats-Msg-Id header, so the stream's
// duplicate window drops what a relay re-publishes after a crash between
// publish and delete. It publishes asynchronously with a bounded number of
// acknowledgements in flight and classifies each message's failure for the
// relay (permanent: no stream for the subject, message too large; the rest
// retryable). [CoreSink] publishes on core NATS, for subjects without a
// stream.
package nats
