// Package migrate creates, upgrades, checks, undoes and exports the tables
// of idemq's Postgres stores: the inbox, the outbox, the webhook registry and
// the request store. It is modelled on River's rivermigrate.
//
// A [Migrator] works on the stores it is given, each of which offers its
// migrations as a [Source] ([Store]); the package itself imports no store,
// so a program that uses the inbox alone compiles no broker, Redis, AWS or
// gRPC library by migrating it:
//
//	m := migrate.New(pool, inboxStore, outboxStore)
//	applied, err := m.Migrate(ctx)  // at deploy time
//	err = m.Validate(ctx)           // at start: ErrPending until then
//
// Each store's Migrate method is this, for that store alone.
//
// # The migration log
//
// Every schema that holds idemq tables has a table [LogTable]
// (idemq_migrations) with one row per applied migration of each store,
// keyed by component and table: two inboxes, or an inbox and a request
// store, in one schema keep their versions apart. Only this package reads
// and writes it.
//
// # Concurrency
//
// [Migrator.Migrate] and [Migrator.Down] run in one transaction that first
// takes one transaction-scoped advisory lock, the same for every idemq
// migration of every store: any number of processes may migrate at once
// (several replicas starting, a relay with --migrate beside idemq migrate);
// one applies and the others wait, then find nothing left to do. A failure
// rolls back everything the call did.
//
// # Down
//
// Every migration has a down step. [Migrator.Down] undoes the migrations
// above a version, newest first; Down(ctx, 0) drops every table of the
// stores and keeps their rows nowhere, so take a backup first. Stop the
// processes that use the tables before going down: a relay of a newer
// version, for one, needs the tables that an older version lacks.
//
// # Export for other tools
//
// Teams that apply every schema change with golang-migrate, goose, Atlas,
// Flyway or psql take the same migrations as files: [Migrator.Export] (or
// idemq migrate export DIR) writes them numbered, in the layout of the tool
// ([Format]), with the schema and table names filled in. The files record
// themselves in the migration log too, so [Migrator.Validate] and the idemq
// binary accept a database migrated from them, and Migrate can take over
// later. Export into the same directory after every upgrade of idemq: the
// files there stay, and the new ones are numbered after them.
package migrate
