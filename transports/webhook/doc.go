// Package webhook delivers webhooks from the outbox, effectively once, and
// receives them the same way. It follows Standard Webhooks
// (https://www.standardwebhooks.com).
//
// The package holds the two halves every idemq transport has: the
// outbound [Sink] a relay delivers through, and the inbound [Receiver].
// What they share lives in two packages of their own, each with one
// concern: endpoints (the registry of receivers, in Postgres, and the
// fan-out Publisher onto the outbox: what the console and the binary
// import, without the relay, the consumer or this package's HTTP client)
// and signing (Standard Webhooks keys, sign and verify; no database).
//
// # Sending
//
// An [endpoints.Registry] keeps the endpoints in Postgres: URL, event-type
// filter, key ring, enabled state, timeout, concurrency and rate limit.
// [endpoints.Publisher.PublishTx] fans a business event out inside the
// caller's transaction: one outbox row per subscribed endpoint,
// destination "webhook/<endpoint id>", ordering key "<endpoint id>/<event
// key>", so every endpoint's deliveries are ordered, retried and
// dead-lettered on their own. The relay hands those rows to a [Sink]
// (route [endpoints.DestinationPrefix] to it), which POSTs each one with
//
//	webhook-id:        the outbox row's id, the same on every retry
//	webhook-timestamp: the attempt's Unix time
//	webhook-signature: "v1,<HMAC-SHA256>" per whsec_ secret and
//	                   "v1a,<ed25519>" per whsk_ key, space-separated,
//	                   over "id.timestamp.body"
//	Idempotency-Key:   the webhook-id again
//
// plus the row's own headers (content type, trace context).
//
// # Outcomes
//
// A 2xx is delivered. 3xx (never followed), 408, 425, 429, 5xx, timeouts and
// connection errors are retried by the relay with its backoff, no sooner
// than a Retry-After (bounded by [Config.MaxRetryAfter]). Other 4xx, a
// "webhook-delivery: abort-message" answer and an address the SSRF guard
// refuses are permanent: the row becomes a dead letter whose error keeps
// the status and the first [Config.ErrorBody] bytes of the body. A 410
// disables the endpoint, and so does [Config.DisableAfter] of failures
// without a success. A disabled endpoint's rows are held in the outbox,
// neither sent nor counted as attempts, and flow in key order once
// [endpoints.Registry.Enable] runs.
//
// # Isolation
//
// Each endpoint has its own concurrency bound, token-bucket rate limit and
// breaker: after [Config.BreakerFailures] retryable failures in a row its
// rows are held out of the relay's batches, without burning attempts,
// until it half-opens [Config.BreakerCooldown] later (5 s by default);
// then one delivery probes it while the others wait for its answer (a
// second at most). A success closes the breaker and the rows flow; a
// failure opens it again for twice the cooldown, up to 64 times. A held
// row is put back exactly until the breaker half-opens, never behind a
// backoff, and its recorded error says so ("held, not attempted: endpoint
// …: breaker open after 5 failures in a row; due again when it half-opens
// in 4.2s"). An outage shorter than the cooldown thus costs the
// endpoint's rows about one cooldown. A relay batch waits for its slowest
// delivery, so a hanging endpoint costs a batch its timeout once per
// cooldown; run the relay with several Workers so that the other
// workers' batches flow meanwhile.
//
// The breaker lives in the Sink's memory, one per endpoint per relay
// process. Each change of its state (open, half-open, closed; never each
// delivery) is logged ("webhook: breaker open", "half-open", "closed") and
// recorded on the endpoint's registry row (Endpoint.Breaker, BreakerSince
// and BreakerRelay, registry migration 0002) by a goroutine of its own,
// off the delivery's path; a failed write is logged and fails no delivery.
// With several relays each has its own breaker for an endpoint and the
// last report wins, so the row says what one relay saw last, and when; a
// relay that stopped leaves its last report until another relay's breaker
// changes. The operator console and `idemq webhook list` show it beside
// FailingSince and the disabled state.
//
// # SSRF
//
// The Sink's dialer checks every resolved address on every connection
// (code.dny.dev/ssrf): loopback, private, link-local, metadata and the
// other special-purpose addresses are refused unless
// [Config.AllowedNetworks] lets them through, whether they come as a
// literal, a DNS name or (never followed anyway) a redirect.
//
// # Receiving
//
// A [Receiver] verifies the signature (constant-time, both schemes, any
// key of its ring, timestamp within [ReceiverConfig.Tolerance]) and
// applies each webhook-id once through a consumer.Consumer, as the Kafka
// and NATS subscribers do: built with [Handle], the [Handler] runs in the
// transaction that records the id in the consumer's inbox, so a
// redelivery after a sender's crash is answered 200 without running it
// again; built with consumer.NewLeased and [HandleLeased], a
// [LeasedHandler] with effects outside Postgres runs under a lease the
// consumer renews, with a fencing token for the downstream call. Bad or
// stale signatures get 401 and record nothing; the consumer's Result
// decides the rest (see [Receiver]).
package webhook
