// Package testenv gives tests, examples and benchmarks real servers: a fresh
// Postgres database per test ([Postgres], [CreateDatabase]), a Kafka
// wire-protocol broker ([Kafka], kfake in-process) and NATS with JetStream
// ([NATS], nats-server in-process). Environment variables point it
// elsewhere:
//
//	IDEMQ_TEST_DATABASE_URL   an admin connection to a Postgres server
//	                          (default postgres://postgres@127.0.0.1:5432/postgres)
//	IDEMQ_TEST_KAFKA_BROKERS  comma-separated brokers of a real Kafka cluster
//	                          (default: an in-process kfake broker)
//	IDEMQ_TEST_NATS_URL       a NATS server with JetStream
//	                          (default: an in-process nats-server)
//
// A missing server fails the test with a message that says how to start it;
// nothing is ever skipped silently.
package testenv
