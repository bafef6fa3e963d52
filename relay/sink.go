package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// Message is an outbox row on its way to a [Sink].
type Message struct {
	// ID is the outbox row's UUIDv7; sinks stamp it on the published message
	// as its message id, so a receiving inbox or a JetStream stream drops
	// the duplicates a relay crash between publish and delete creates.
	ID uuid.UUID
	// Destination names the sink (through a [Router]) and, inside it, the
	// topic, subject or URL.
	Destination string
	// Key orders messages: the relay publishes rows of one key in enqueue
	// order. Empty means unordered. Kafka sinks use it as the message key.
	Key     string
	Payload []byte
	Headers map[string]string
	// Attempts counts earlier failed publishes of this row.
	Attempts  int
	CreatedAt time.Time
}

// Sink publishes outbox messages to a broker or endpoint.
//
// Messages of one key appear in batch in their order. To keep that order
// downstream a Sink publishes them in batch order and, once a message of a
// key failed, does not deliver the later messages of that key in the same
// batch but reports them failed too (with [ErrSkipped] or their own error):
// the relay retries them after the failed one. A Sink may publish messages
// of different keys concurrently.
type Sink interface {
	// Publish delivers batch. It returns nil when every message was
	// delivered; a *[PublishError] when only some failed; any other error
	// when the whole batch failed. Errors are retryable unless marked with
	// idemq.Permanent; idemq.RetryAfter sets the earliest retry. Publish
	// must return when ctx is done.
	Publish(ctx context.Context, batch []Message) error
}

// ErrSkipped is what a Sink reports for a message it did not attempt
// because an earlier message of the same key failed in the same batch. The
// relay puts such messages back behind the failed one without counting an
// attempt.
var ErrSkipped = errors.New("relay: skipped: an earlier message of its key failed")

// SinkFunc adapts a function to the [Sink] interface.
type SinkFunc func(ctx context.Context, batch []Message) error

// Publish calls f(ctx, batch).
func (f SinkFunc) Publish(ctx context.Context, batch []Message) error { return f(ctx, batch) }

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
