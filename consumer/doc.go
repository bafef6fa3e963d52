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
// Handler errors are retryable unless wrapped with [Permanent]; a handler
// may wrap an error with idemq.RetryAfter to set the earliest retry. A
// failed attempt rolls back everything it wrote (a failed handler never
// marks a message as seen) and is retried with exponential backoff and full
// jitter, in place by default (which keeps a partition's order) or by the
// transport in [Config.Redeliver] mode, until [Config.MaxAttempts] or
// [Config.MaxElapsed]; then the message is a dead letter.
//
// # Batches
//
// [Consumer.ProcessBatch] applies many messages in one transaction: one
// statement claims every key, each handler runs under a savepoint, one
// commit settles them all. This is the throughput mode for transports that
// fetch in batches.
//
// # Leased mode
//
// [NewLeased] is for side effects outside Postgres. The key is held under a
// lease with a fencing token ([inbox.Lease]) while the [LeasedHandler] runs,
// extended as long as it runs, and recorded as applied when it returns nil.
// A worker whose lease was taken over cannot record its result; pass the
// key and token downstream so the far side can reject it too.
//
// # Observability
//
// Every log line about a message carries its scope and key; [Hooks] report
// each result (outcome and latency) and each in-process retry for metrics.
package consumer
