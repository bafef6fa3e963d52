// Package idemwatermill puts idemq under Watermill: a [message.Publisher]
// that writes to idemq's outbox inside the caller's transaction, a
// [message.Subscriber] fed by idemq's relay, and a handler middleware that
// applies each message once through the inbox, in the handler's
// transaction. It is a module of its own, so that idemq's users who do not
// use Watermill never download it.
//
// # Publishing
//
// [NewPublisher] on a pgx.Tx writes the messages of every Publish call into
// the outbox inside that transaction (as watermill-sql's Publisher on a
// *sql.Tx does): they are published if and only if the business
// transaction commits. On a pool it writes each Publish call in a
// transaction of its own. The Watermill topic is the outbox row's
// destination; the message's UUID becomes the row's id when it is a UUID
// in canonical form (so that idemq's Kafka, NATS and webhook sinks stamp it
// as the message id), and travels in the [UUIDHeader] header otherwise.
// Metadata become headers: their names must be HTTP tokens and their values
// UTF-8 without NUL, CR or LF (outbox.Message.Headers), or Publish fails
// with outbox.ErrInvalidMessage and writes nothing.
//
// # Subscribing
//
// A [Subscriber] runs a relay (package relay) on its outbox while it has
// subscriptions, and hands each row to a subscription of the row's topic,
// one message at a time: the row is deleted once the message is acked. So:
//
//   - Messages are persistent: published before anyone subscribed, or while
//     every subscriber was down, they wait in the outbox, and a Subscriber
//     in another process gets them.
//   - Every Subscriber on one outbox shares its messages: each message goes
//     to one subscription of its topic, in any process (one consumer group
//     per outbox; Watermill's ConsumerGroups feature is not offered, use an
//     outbox table per group). A message of a topic this Subscriber has no
//     subscription for waits [SubscriberConfig.UnsubscribedHold] and is
//     tried again, so give Watermill an outbox table of its own (say
//     outbox.Config{Table: "watermill_outbox"}) and subscribe every process
//     that runs a Subscriber on it to the same topics.
//   - Order: the messages of one ordering key ([PublisherConfig.Key], by
//     default the topic) are delivered in publish order, one after the
//     other, across Subscribers, crashes and Nacks, like the relay publishes
//     a key's rows.
//   - A Nack is not a failure: the message (and its key's followers) comes
//     back after [SubscriberConfig.NackDelay], without counting an attempt
//     toward the relay's dead letters. Bound the retries of a handler with
//     the [Middleware] (which dead-letters in the inbox after its Retry
//     budget) or Watermill's Retry and Poison middlewares.
//   - Delivery is at least once: the relay deletes the rows of a batch
//     together, once each of its messages was acked or nacked, so a process
//     that dies mid-batch delivers that batch's acked messages again, with
//     the same UUIDs. The [Middleware] turns that into once.
//
// # Applying once
//
// [NewMiddleware] returns a [Middleware] whose Wrap method is a
// message.HandlerMiddleware: the handler runs inside the transaction that
// records the message's UUID in the inbox (consumer.Consumer), reads that
// transaction with [Tx], and its writes commit if and only if the message
// is recorded as applied. A redelivery is acked without running the handler.
// Messages the handler should emit exactly when its writes commit go into
// the outbox on the same transaction: NewPublisher(tx, ...).
package idemwatermill
