package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemq/idemq/outbox"
)

// Message is an outbox row on its way to a [Sink]: the enqueued
// outbox.Message (its ID is the row's UUIDv7, which sinks stamp on the
// published message as its message id, so a receiving inbox or a JetStream
// stream drops the duplicates a relay crash between publish and delete
// creates) and what the relay knows of the row.
type Message struct {
	outbox.Message
	// Attempts counts earlier failed publishes of this row.
	Attempts int
	// CreatedAt is when the row was enqueued.
	CreatedAt time.Time
	// Seq is the row's place in the outbox: the relay publishes the
	// messages of a key in Seq order, and a replayed dead letter keeps its
	// Seq.
	Seq int64
	// Partition is the key partition the row belongs to (0 to 63), -1 for
	// a message without a key. The relay worker that owns a partition's
	// lease is the only one publishing its messages.
	Partition int
	// LeaseToken is the fencing token of the lease under which the relay
	// claimed the message: it grows with every change of the partition's
	// owner, so a Sink (or a transactional producer keyed by partition)
	// that records it can tell a stale owner's late publish from its
	// successor's. Zero for a message without a key, which no lease
	// covers.
	LeaseToken int64
}

// Sink publishes outbox messages to a broker or endpoint.
//
// Messages of one key appear in batch in their order. To keep that order
// downstream a Sink publishes them in batch order and, once a message of a
// key failed, does not deliver the later messages of that key in the same
// batch but reports them failed too (with [ErrSkipped] or their own error):
// the relay retries them after the failed one. [Failures] implements that
// rule. A Sink may publish messages of different keys concurrently. The
// relay hands a Sink copies of the rows, which it may change. Package
// relaytest checks a Sink against this contract.
type Sink interface {
	// Publish delivers batch, the messages of relay batch id (or all of
	// them, see [Router]). It returns nil when every message was
	// delivered; a *[PublishError] when only some failed; any other error
	// when the whole batch failed. Errors are retryable unless marked with
	// idemq.Permanent; idemq.RetryAfter sets the earliest retry. Publish
	// must return when ctx is done. A Sink that wraps another passes id
	// on.
	Publish(ctx context.Context, id BatchID, batch []Message) error
}

// BatchID identifies a relay batch within the process. A [Router] makes
// one call per destination of a batch, all with the batch's id; a
// [Watermarker] that commits a transaction per call names the rows of all
// the calls of one batch in the last one's watermark, since a crash before
// the batch's delete leaves all of them behind. Zero is no relay batch (a
// Sink called directly): each call is a batch of its own.
type BatchID uint64

// ErrSkipped is what a Sink reports for a message it did not attempt
// because an earlier message of the same key failed in the same batch. The
// relay puts such messages back behind the failed one without counting an
// attempt. A Sink holds the messages of a destination that cannot take them
// now (a disabled webhook endpoint, an open breaker) with
// idemq.RetryAfter(ErrSkipped-wrapping error, d): they come back after d,
// still without counting an attempt.
var ErrSkipped = errors.New("relay: skipped: an earlier message of its key failed")

// SinkFunc adapts a function to the [Sink] interface.
type SinkFunc func(ctx context.Context, id BatchID, batch []Message) error

// Publish calls f(ctx, id, batch); a nil f fails the batch.
func (f SinkFunc) Publish(ctx context.Context, id BatchID, batch []Message) error {
	if f == nil {
		return errors.New("relay: nil SinkFunc")
	}
	return f(ctx, id, batch)
}

// PublishError reports per-message failures of a batch: Failed maps an
// index of the batch to its error; messages not in Failed were delivered.
type PublishError struct {
	Failed map[int]error
}

func (e *PublishError) Error() string {
	first := -1
	for i := range e.Failed {
		if first < 0 || i < first {
			first = i
		}
	}
	if first < 0 {
		return "relay: publish failed"
	}
	return fmt.Sprintf("relay: %d of the batch failed, first message %d: %v", len(e.Failed), first, e.Failed[first])
}
