// Package consumer applies messages from any transport effectively once.
//
// A [Consumer] wraps a handler. For every message it derives an idempotency
// key (the message id, or a business key from [Config.KeyFunc]) and a
// payload fingerprint, and records the key in the Postgres inbox (package
// inbox) in the same transaction as the handler's writes:
//
//	c, err := consumer.New(pool, "billing", func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
//		_, err := tx.Exec(ctx, "INSERT INTO invoices ...", ...)
//		return err
//	}, consumer.Config{})
//	result := c.Process(ctx, msg)
//	if result.Settled() {
//		// ack the message / commit the offset
//	}
//
// # Outcomes
//
// [Consumer.Process] returns a [Result] whose [Outcome] tells the transport
// what to do: Applied and Duplicate are acknowledged; Conflict (same key,
// other payload) and DeadLettered are acknowledged too, so one poison
// message never blocks a partition, and they are kept in the inbox and
// handed to [Config.DeadLetter]; Retry means nothing was committed and the
// message must be redelivered after Result.RetryAfter.
//
// # Errors and retries
//
// Handler errors are retryable unless wrapped with idemq.Permanent; a
// handler may wrap an error with idemq.RetryAfter to set the earliest
// retry. A failed attempt rolls back everything it wrote (a failed handler
// never marks a message as seen), is counted in the inbox in a short
// transaction of its own (the record is FAILED_RETRYABLE until an attempt
// succeeds), and is retried with exponential backoff and full jitter, in
// place by default (which keeps a partition's order) or by the transport in
// [Config.Redeliver] mode, until Retry.MaxAttempts failed attempts or
// Retry.MaxElapsed ([Config.Retry]); then the message is a dead letter.
//
// Only handler failures count. A crash, a lost connection, a cancelled
// context or a database error is never a failed attempt: the message is
// Retry with nothing committed and nothing counted, so a consumer killed
// again and again never dead-letters a message whose handler never failed.
// A transport's own delivery count is only a far backstop
// ([RedeliverBackstop]). A database error (not a cancelled context) also
// sets [Result.Unavailable]: every message would fail alike, so the
// transports of idemq keep such a message and the ones behind it in order,
// wait with a capped, jittered backoff, and log the outage once instead of
// once per message.
//
// # Batches
//
// [Consumer.ProcessBatch] applies many messages in one transaction: one
// statement claims every key, the handlers run under one savepoint, one
// commit settles them all; if a handler fails, the batch is applied again
// with a savepoint per message, so the failure rolls back only its own
// message. This is the throughput mode for transports that fetch in
// batches (their Batch options).
//
// A consumer made by [NewBatched] takes a [BatchHandler], called once per
// batch with every message new to the inbox (duplicates and conflicts
// filtered out), so its writes can be one statement (INSERT ... SELECT FROM
// unnest, or CopyFrom) instead of a round trip per message: that is what a
// per-message handler can never reach. If it fails, the messages are
// applied one by one, each in a call of its own, with the outcomes of
// per-message handlers.
//
// # Leased mode
//
// [NewLeased] is for side effects outside Postgres. The key is held under a
// lease with a fencing token ([idemq.Lease]) while the [LeasedHandler] runs,
// extended as long as it runs, and recorded as applied when it returns nil.
// A worker whose lease was taken over cannot record its result; pass the
// key and token downstream so the far side can reject it too.
//
// # Observability
//
// Every log line about a message carries its scope and key; [Hooks] report
// each result (outcome and latency) and each in-process retry
// ([Hooks.OnRetried]) for metrics.
package consumer
