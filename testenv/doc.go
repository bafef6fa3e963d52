// Package testenv gives tests, examples and benchmarks real servers: a fresh
// Postgres database per test (and, in the transport packages' helpers, real
// Kafka and NATS brokers). Environment variables point it elsewhere:
//
//	IDEMQ_TEST_DATABASE_URL  an admin connection to a Postgres server
//	                         (default postgres://postgres@127.0.0.1:5432/postgres)
//
// A missing server fails the test with a message that says how to start it;
// nothing is ever skipped silently.
package testenv
