package relay

import (
	"context"
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
type Sink interface {
	// Publish delivers batch. It returns nil when every message was
	// delivered; a *[PublishError] when only some failed; any other error
	// when the whole batch failed. Errors are retryable unless marked with
	// idemq.Permanent; idemq.RetryAfter sets the earliest retry.
	Publish(ctx context.Context, batch []Message) error
}

// PublishError reports per-message failures of a batch: Failed maps an
// index of the batch to its error; messages not in Failed were delivered.
type PublishError struct {
	Failed map[int]error
}

func (e *PublishError) Error() string {
	for i, err := range e.Failed {
		return fmt.Sprintf("relay: %d of the batch failed, e.g. message %d: %v", len(e.Failed), i, err)
	}
	return "relay: publish failed"
}
