// Package testenv gives tests, examples and benchmarks real servers: a fresh
// Postgres database per test ([Postgres], [CreateDatabase]), a Kafka
// wire-protocol broker ([Kafka], kfake in-process), NATS with JetStream
// ([NATS], nats-server in-process), Redis ([Redis], the machine's server
// with a key prefix per test) and a DynamoDB API server ([DynamoDB],
// dynalite from testenv's node_modules: `npm ci --prefix testenv`, which
// `make test` runs). Environment variables point it elsewhere:
//
//	IDEMQ_TEST_DATABASE_URL   an admin connection to a Postgres server
//	                          (default postgres://postgres@127.0.0.1:5432/postgres)
//	IDEMQ_TEST_KAFKA_BROKERS  comma-separated brokers of a real Kafka cluster
//	                          (default: an in-process kfake broker)
//	IDEMQ_TEST_NATS_URL       a NATS server with JetStream
//	                          (default: an in-process nats-server)
//	IDEMQ_TEST_REDIS_URL      a Redis server (default redis://127.0.0.1:6379/0)
//	IDEMQ_TEST_DYNAMODB_URL   a DynamoDB API endpoint
//	                          (default: a dynalite per test binary)
//
// Outage tests get servers of their own to stop and start again:
// [StartRedis] (a redis-server process), [StartDynalite] and [NewProxy] (a
// TCP forwarder that refuses connections while stopped, for Postgres).
// [Main] and [RunProgram] run the examples' programs, as a main function
// and as a test.
// [PgBouncer] puts a pgbouncer of the test's own (transaction mode) in
// front of a test database, for the pooler tests. [Logs] keeps what a
// component logged, for tests of its log lines.
// Tests that need Postgres server settings of their own
// (max_prepared_transactions, ...) start a private server from the
// machine's Postgres binaries with [PrivatePostgres]; [EnsurePostgres]
// starts one for `make test` and `make demo` when nothing answers at
// IDEMQ_TEST_DATABASE_URL.
//
// A missing server fails the test with a message that says how to start it;
// nothing is ever skipped silently.
package testenv
