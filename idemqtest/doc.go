// Package idemqtest is the test kit for code built on idemq: it waits for
// what a consumer, relay or subscriber does in the background, and it
// counts side effects per key so that a test can say "applied exactly
// once" and mean it.
//
// It needs nothing but Postgres (through pgx) and the standard library, so
// a user's test imports it without compiling a broker client or a server.
//
// # The setup pattern
//
// Every idemq test has the same shape, and the tests in this repository
// follow it:
//
//  1. One fresh database per test (in this repository testenv.Postgres(t);
//     in yours, whatever creates a database for a test and drops it at
//     cleanup). A test that owns its database and its broker names (topics,
//     streams, subjects with a per-test suffix) calls t.Parallel().
//  2. One [Effects] on that database. The handler calls [Effects.Record]
//     with its transaction, so a side effect commits with the inbox row or
//     not at all; a leased-mode handler, whose side effect lives outside
//     Postgres, records into a [Recorder] instead.
//  3. Build the consumer (or relay, or subscriber), migrate it, start it
//     under t.Context(), stop it in t.Cleanup.
//  4. Deliver, crash, redeliver; then [WaitFor] the state the test expects
//     and [Effects.AssertOnce] the keys. A deadline in WaitFor guards
//     against a hang; it is never a timing assertion.
//
// The Example shows the whole pattern on a consumer.
package idemqtest
