// Package kafka connects idemq to Kafka through segmentio/kafka-go.
//
// # Outbound
//
// [Sink] is a relay.Sink on a kafka-go Writer: the relay drains the outbox
// into Kafka, one WriteMessages call per batch, the outbox message id in the
// Idempotency-Key header and the outbox key as the message key (so per-key
// order survives into the partition). [NewWriter] returns a Writer
// configured for it.
package kafka
