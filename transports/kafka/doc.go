// Package kafka connects idemq to Kafka through segmentio/kafka-go.
//
// # Inbound
//
// [Subscriber] joins a consumer group and applies every message through a
// consumer.Consumer: one goroutine per assigned partition, in offset order;
// offsets committed only after the message's transaction committed or the
// consumer recognised it as a duplicate, a conflict or a dead letter; a
// Retry outcome holds that message and those behind it, never skipping
// it, and processes them again in order (while the database is down, with
// a capped backoff and without fetching). In Batch mode what was fetched for a partition is applied with
// consumer.ProcessBatch (one transaction, a savepoint per message) and
// committed once. A Subscriber is an idemq.Service: idemq.Start returns
// once it joined the group, and cancelling Run's context finishes the
// in-flight batch (within ShutdownGrace), commits and leaves the group.
// Records with an empty value and tombstones are messages with an empty
// payload.
//
// Message identity: the Idempotency-Key header (configurable), falling back
// to "topic/partition/offset" ([FallbackID]) when the header is absent. A
// header that is present but unusable (empty, over the inbox key limit, not
// UTF-8) dead-letters the message by default, or gets the fallback id with
// [SubscriberConfig.FallbackOnInvalidID]; either way the partition moves on.
// Handlers reach the Kafka record (key, topic, partition, offset, time)
// with [Source]; its headers are in consumer.Message.Headers.
//
// Dead letters and conflicts can be copied to a dead-letter topic
// ([SubscriberConfig.DeadLetterTopic]) before their offset is committed.
//
// # Outbound
//
// [Sink] is a relay.Sink on a kafka-go Writer: the relay drains the outbox
// into Kafka, one WriteMessages call per batch, the outbox message id in the
// Idempotency-Key header and the outbox key as the message key (so per-key
// order survives into the partition). [NewWriter] returns a Writer
// configured for it.
//
// kafka-go has no idempotent or transactional producer: a relay crash
// between publish and delete publishes a row again (with the same id,
// which a receiving inbox drops). Package transports/kafka/franz has a
// franz-go Sink with an idempotent producer and a transactional TxSink
// that delivers each keyed outbox message exactly once to consumers
// reading committed data.
//
// # Why kafka-go's ConsumerGroup and partition Readers
//
// kafka-go's group-mode Reader commits offsets by itself and hides
// partition boundaries; the Generation API gives one callback per assigned
// partition with its committed offset, ends the generation on a rebalance
// only after every callback returned (so a revoked partition commits what
// it finished before anyone else reads it), and ends a hold of messages
// with the generation. It works unchanged on the in-process kfake broker and on real
// brokers.
package kafka
