// Package peers measures idemq next to its peers on one Postgres, in one
// run: the Watermill SQL outbox (watermill-sql's Publisher inside the
// business transaction, its Subscriber driving Watermill's forwarder),
// idemq's outbox and relay, and between the two idemq's Watermill adapter
// (idemwatermill: Watermill messages through idemq's outbox and relay into
// a Subscriber's channel). It is a module of its own so that idemq's users
// never download the peers' code; run it with `make bench-peers`.
//
// Every benchmark alternates the peers in rounds, so load from elsewhere on
// the machine hits them alike, and reports idemq's figure over Watermill's
// as its ratio and the adapter's over Watermill's as its adapter_ratio.
package peers
