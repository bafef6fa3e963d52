// Package peers measures idemq next to its peers on one Postgres, in one
// run: the Watermill SQL outbox (watermill-sql's Publisher inside the
// business transaction, its Subscriber driving Watermill's forwarder) and
// idemq's outbox and relay. It is a module of its own so that idemq's users
// never download the peers' code; run it with `make bench-peers`.
//
// Every benchmark alternates the two in rounds, so load from elsewhere on
// the machine hits both alike, and reports idemq's figure over Watermill's
// as its ratio.
package peers
