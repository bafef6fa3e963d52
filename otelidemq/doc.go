// Package otelidemq reports what idemq does as OpenTelemetry metrics and
// traces. It depends on the OpenTelemetry API only: the application picks
// the SDK and the exporters (Prometheus, OTLP) and passes its providers in
// [Config], or sets the global ones.
//
// Metrics come from the Hooks of each component: [Telemetry.ConsumerHooks],
// [Telemetry.RelayHooks], [Telemetry.HTTPHooks], [Telemetry.GRPCHooks] and
// [Telemetry.WebhookHooks] each return a Hooks value that records the
// metrics and then calls the hooks passed in, so an application keeps its
// own. Names follow the OpenTelemetry messaging semantic conventions where
// one exists and are idemq.* otherwise:
//
//	messaging.process.duration              histogram s    consumer handling of one message
//	                                                       messaging.operation.name=process,
//	                                                       idemq.scope, idemq.outcome
//	idemq.consumer.messages                 counter        messages by final outcome
//	                                                       idemq.scope, idemq.outcome
//	idemq.consumer.retries                  counter        failed attempts retried in process
//	                                                       idemq.scope
//	messaging.client.sent.messages          counter        messages the relay published
//	                                                       messaging.operation.name=send, messaging.destination.name
//	messaging.client.operation.duration     histogram s    one Sink call of the relay that delivered
//	                                                       messages (a batch); messaging.operation.name=send
//	idemq.relay.failures                    counter        failed publishes of a message (attempted;
//	                                                       held and skipped ones are not)
//	                                                       messaging.destination.name
//	idemq.relay.held                        counter        messages held without an attempt
//	                                                       messaging.destination.name,
//	                                                       idemq.relay.hold_reason (no_route, sink)
//	idemq.relay.skipped                     counter        messages put back behind an earlier failed
//	                                                       message of their key, not attempted
//	                                                       messaging.destination.name
//	idemq.relay.retries                     counter        failed messages rescheduled
//	                                                       messaging.destination.name
//	idemq.relay.dead_letters                counter        messages moved to the dead letters
//	                                                       messaging.destination.name
//	idemq.outbox.pending                    gauge          messages waiting to be published
//	idemq.outbox.oldest_pending.age         gauge s        age of the oldest of them
//	idemq.outbox.dead_letters               gauge          dead letters in the outbox
//	idemq.outbox.unrouted                   gauge          messages held: no route matches them
//	idemq.request.results                   counter        protected requests by result
//	                                                       idemq.transport (http, grpc), idemq.result
//	idemq.webhook.deliveries                counter        webhook deliveries
//	                                                       idemq.webhook.endpoint, idemq.webhook.class
//	idemq.webhook.delivery.duration         histogram s    one webhook delivery, same attributes
//	idemq.webhook.disabled                  counter        endpoints the Sink disabled
//	                                                       idemq.webhook.endpoint
//
// idemq.outcome is applied, duplicate, conflict, retry or dead-lettered.
// idemq.result is the transport's Result: completed, released, replayed,
// in_flight (a concurrent request held the key), conflict (the key was
// reused for another request), rejected, unavailable (the store failed
// before the handler ran), fenced, unprotected, store_failed (the
// outcome could not be stored) or misconfigured (the server's scope or
// fingerprint function, or the store's setup, is wrong: HTTP 500, gRPC
// INTERNAL, and the handler did not run): replays, in-flight conflicts
// and store errors are its replayed, in_flight, unavailable and
// store_failed series; misconfigured calls for a fix, not for capacity.
// idemq.webhook.class is 2xx, 3xx, 4xx, 5xx or network (no response).
// Through the OpenTelemetry Prometheus exporter with the translation
// strategy otlptranslator.UnderscoreEscapingWithSuffixes, dots become
// underscores, counters end in _total and durations in _seconds:
// idemq_consumer_messages_total, messaging_process_duration_seconds,
// idemq_outbox_oldest_pending_age_seconds, idemq_outbox_pending. Pin the
// strategy: the exporter's default is announced to change.
//
// The relay's gauges are recorded every relay.Config.StatsInterval. The
// hooks do not know which broker a destination lives on, so the metrics
// carry no messaging.system; the spans do.
//
// Traces follow one message from the business transaction to each
// consumer, in one trace. The business transaction's span is the
// caller's (an HTTP server span from otelhttp, for instance):
//
//   - outbox.Outbox.EnqueueTx stores the trace context of its ctx in the
//     message's headers (traceparent, tracestate) when the outbox's
//     Config.Headers is [OutboxHeaders].
//   - [Telemetry.Sink] wraps the relay's Sink: each message gets a
//     "send <destination>" span (PRODUCER) whose parent is the stored
//     context, which it also links to as the conventions ask; its own
//     context replaces the stored one in the headers the Sink publishes:
//     Kafka record headers, NATS headers (lower-case names: NATS headers
//     are case-sensitive) and webhook request headers.
//     Its attributes: messaging.system, messaging.operation.name and
//     .type (send), messaging.destination.name, messaging.message.id
//     (the outbox id) and idemq.relay.attempt (1 for the first publish).
//   - [Telemetry.Handler] and [Telemetry.LeasedHandler] wrap a consumer's
//     handler: each attempt runs in a "process <destination>" span
//     (CONSUMER) whose parent is the context in consumer.Message.Headers,
//     with the messaging attributes above (operation process). It wraps
//     the handler, so it works alike under Process and ProcessBatch; a
//     duplicate, which never reaches the handler, gets no span.
//   - [Telemetry.HTTPHooks] sets idemq.result (completed, replayed,
//     conflict, ...) on the span of each protected request.
//   - A webhook receiver continues the trace with any HTTP server
//     instrumentation (otelhttp): the delivery carries traceparent.
//
// The trace context travels in the message headers, so an outbox row, a
// Kafka record and a NATS message each carry the context of the step
// before them; the send span of a retried publish has the same parent as
// the first.
package otelidemq
