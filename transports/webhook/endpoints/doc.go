// Package endpoints keeps the receivers of outgoing webhooks in Postgres
// and fans business events out to them through the outbox. It is the part
// of idemq's webhooks that operators and the producing code see: the
// console and `idemq webhook` read and change the [Registry]; a service
// publishes with [Publisher.PublishTx] inside its business transaction.
// Delivery is package webhook's Sink, behind a relay; the keys are package
// signing's.
//
// # Registry
//
// A [Registry] stores each [Endpoint]: URL, event-type filter, key ring
// (with rotation: [Registry.RotateKey] lets the old keys sign on for a
// grace period), enabled state, timeout, concurrency and rate limit. It
// also holds what the delivering Sinks report: the failure clock
// (Endpoint.FailingSince) and each Sink's breaker changes
// (Endpoint.Breaker, BreakerSince, BreakerRelay). Its tables come from
// embedded migrations, component "webhook": [Registry.Migrate], or
// `idemq migrate --components webhook`.
//
// # Fan-out
//
// [Publisher.PublishTx] writes one outbox row per event and subscribed,
// enabled endpoint, in the caller's transaction: destination
// [DestinationPrefix]+"<endpoint id>", ordering key "<endpoint id>/<event
// key>", so every endpoint's deliveries are ordered, retried and
// dead-lettered on their own, and one failing endpoint never holds back
// another's.
//
// # The name
//
// The package is named for what it holds, so that it imports beside
// net/http and package webhook without an alias: endpoints.Registry,
// endpoints.Endpoint, endpoints.Publisher. It imports neither the relay
// nor the consumer nor an HTTP client: a program that only manages or
// publishes to endpoints compiles none of them.
package endpoints
