// Package franz connects idemq's relay to Kafka through franz-go (kgo), the
// client for the idempotent and transactional paths that kafka-go cannot
// offer (package transports/kafka stays the default).
//
// # Outbound
//
// [Sink] is a relay.Sink on one idempotent kgo client: the outbox message
// id in the Idempotency-Key header, the outbox key as the record key
// (murmur2-hashed, as the Java client and kafka-go's Murmur2Balancer do).
// A relay crash between publish and delete publishes a row again, with the
// same id, which a receiving inbox drops.
//
// [TxSink] publishes each outbox key partition's share of a relay batch as
// one Kafka transaction, with one transactional id per partition, fenced by
// the relay's partition leases, plus a watermark record that lets the next
// owner of the partition delete, without publishing them, the rows a crash
// left behind after Kafka had committed them (it implements
// relay.Watermarker). A consumer that reads committed data sees every
// keyed outbox message exactly once.
//
// What stays at least once, even with a TxSink: consumers that read
// uncommitted data (Kafka's default isolation level, and kafka-go's
// Reader unless IsolationLevel is ReadCommitted); unkeyed outbox messages,
// which no lease covers; messages on the topics written by other
// producers; and a watermark lost to retention (a compacted watermark
// topic keeps the last one per partition; a relay outage longer than the
// message topics' retention loses messages, not duplicates them). The
// consumer inbox (package consumer, through [Subscriber] or the kafka-go
// Subscriber) still deduplicates by message id behind it.
//
// # Inbound
//
// [Subscriber] joins a consumer group with kgo and applies every message
// through a consumer.Consumer, committing offsets only after the inbox
// transaction committed; [SubscriberConfig.ReadCommitted] makes it read
// only committed transactional records.
package franz
