// Package nats connects idemq to NATS through nats.go: JetStream (the
// jetstream package, pull consumers) and core NATS subscriptions.
//
// # Inbound: JetStream
//
// [JetStreamSubscriber] wraps a consumer.Consumer around a durable (or
// ephemeral) pull consumer with explicit acknowledgements. It fetches up
// to [JetStreamSubscriberConfig.MaxBatch] messages at a time and applies them in
// stream order, with consumer.Process per message or, in
// [JetStreamSubscriberConfig.Batch] mode, with consumer.ProcessBatch per fetched
// batch (one transaction, a savepoint per message). Each message is then
// settled by its result:
//
//   - Applied, Duplicate: Ack, only after the transaction committed;
//   - Retry after a failed attempt in consumer.Config.Redeliver mode:
//     NakWithDelay(Result.RetryAfter), so the server redelivers it after
//     the backoff delay (the consumer counts attempts by the delivery
//     count);
//   - any other Retry (the database unavailable, a key another worker
//     holds): the message and those fetched behind it are held, in
//     progress, and processed again in order after a capped backoff, with
//     no fetch meanwhile;
//   - Conflict, DeadLettered: published to
//     [JetStreamSubscriberConfig.DeadLetterSubject] if set, then Term.
//
// While messages are fetched and not yet settled they are reported
// InProgress at an interval below the consumer's AckWait, so a long handler
// or batch never makes the server redeliver a message in parallel. A crash
// between the commit and the ack makes the server redeliver after AckWait;
// the inbox recognises the redelivery as a Duplicate and it is acked.
//
// Message identity: the Nats-Msg-Id header (configurable), which the Sinks
// of this package set to the outbox message id; without it
// "stream/sequence" ([FallbackID]), stable across redeliveries.
// A header that is present but unusable (empty, over the inbox key limit,
// not UTF-8) dead-letters the message by default (terminated, copied to the
// dead-letter subject), or gets the fallback id with
// [JetStreamSubscriberConfig.FallbackOnInvalidID]; either way the stream moves on. The
// handler sees the headers in consumer.Message.Headers, the delivery count
// (NumDelivered) in Message.Delivery, and the jetstream.Msg (subject,
// metadata) as Message.Source, also through [JetStreamSource] and [Subject].
//
// Both subscribers are idemq.Services: idemq.Start returns once the
// JetStreamSubscriber sent its first fetch, or once the server confirmed
// the CoreSubscriber's subscription. Shutdown: cancelling Run's context
// stops fetching; the messages already
// fetched are applied and acknowledged (within
// [JetStreamSubscriberConfig.ShutdownGrace]) before Run returns.
//
// # Inbound: core NATS
//
// [CoreSubscriber] wraps a plain or queue-group subscription the same way.
// Core NATS never redelivers: nothing is acknowledged, and a message that
// was not applied when Run stops is gone (while Run runs, one the database
// could not take is held and tried again, the messages behind it waiting
// in the subscription). The wrapper protects against publisher retries
// (and relay re-publishes) only; use JetStream where messages must not be
// lost.
//
// # Outbound
//
// [JetStreamSink] is a relay.Sink publishing outbox rows to JetStream with
// the outbox message id in the Nats-Msg-Id header, so the stream's
// duplicate window drops what a relay re-publishes after a crash between
// publish and delete before any consumer sees it. It publishes
// asynchronously with a bounded number of acknowledgements in flight (one
// per key, so a failure holds back the rest of its key) and
// classifies each message's failure for the relay (permanent: message too
// large, invalid subject; the rest retryable, a subject no stream captures
// included: an outage that ends when the stream is created).
// [CoreSink] publishes on core NATS, for subjects without a stream.
package nats
