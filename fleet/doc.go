// Package fleet describes many Postgres databases to idemq: where they are
// ([Source]: a list, a file, or a catalog query, read again while running),
// how many connections one process may hold on each server ([Budget],
// because max_connections is per server, not per database), and which of
// them saw writes lately ([Watcher], one statistics query per server
// instead of one LISTEN per database).
//
// A team that shards, or gives each tenant a database of its own, writes
// its outbox rows and inbox records in N databases; each database stays
// the only authority over its own rows. The relay's fleet mode
// (relay.Fleet) drains all of them from a few processes within this
// budget.
package fleet
