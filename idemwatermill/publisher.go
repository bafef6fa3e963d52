package idemwatermill

import (
	"errors"
	"fmt"
	"maps"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/nilcheck"
	"github.com/idemq/idemq/outbox"
)

// UUIDHeader carries a Watermill message's UUID when it is not a UUID in
// canonical form and so cannot be the outbox row's id; the Subscriber reads
// it back and does not show it among the metadata. Watermill's Kafka
// adapter names its header the same.
const UUIDHeader = "_watermill_message_uuid"

// ErrPublisherClosed is returned by Publish after Close.
var ErrPublisherClosed = errors.New("idemwatermill: publisher closed")

// PublisherConfig configures a [Publisher]. The zero value is usable.
type PublisherConfig struct {
	// Key is the ordering key of msg published to topic: the Subscriber
	// delivers the messages of one key in publish order, one after the
	// other. Return "" for messages that need no order (they are delivered
	// without waiting for one another's Ack). Defaults to the topic: a
	// topic is delivered in order, as by watermill-sql.
	Key func(topic string, msg *message.Message) string
}

// Publisher writes Watermill messages to an idemq outbox. It is safe for
// concurrent use as far as its handle is (a pgx.Tx is not).
type Publisher struct {
	db     outbox.DB
	ob     *outbox.Outbox
	key    func(string, *message.Message) string
	closed atomic.Bool
}

// NewPublisher returns a Publisher writing into ob through db: a pgx.Tx,
// the business transaction, whose commit publishes the messages (make one
// Publisher per transaction, as with watermill-sql), or a pool or
// connection, on which each Publish call is a transaction of its own.
func NewPublisher(db outbox.DB, ob *outbox.Outbox, cfg PublisherConfig) (*Publisher, error) {
	switch {
	case nilcheck.IsNil(db):
		return nil, idemq.NewConfigError("idemwatermill.Publisher", "db", "is nil: pass the business transaction or a pool")
	case ob == nil:
		return nil, idemq.NewConfigError("idemwatermill.Publisher", "outbox", "is nil")
	}
	if cfg.Key == nil {
		cfg.Key = func(topic string, _ *message.Message) string { return topic }
	}
	return &Publisher{db: db, ob: ob, key: cfg.Key}, nil
}

// Publish writes msgs to topic, all or none, under the context of the
// first message (its trace context goes into the headers when the
// outbox's Config.Headers says so).
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	if p.closed.Load() {
		return ErrPublisherClosed
	}
	if len(msgs) == 0 {
		return nil
	}
	rows := make([]outbox.Message, len(msgs))
	for i, m := range msgs {
		rows[i] = outbox.Message{Destination: topic, Key: p.key(topic, m), Payload: m.Payload, Headers: map[string]string(m.Metadata)}
		if id, err := uuid.Parse(m.UUID); err == nil && id.String() == m.UUID {
			rows[i].ID = id
		} else {
			h := make(map[string]string, len(m.Metadata)+1)
			maps.Copy(h, m.Metadata)
			h[UUIDHeader] = m.UUID
			rows[i].Headers = h
		}
	}
	ctx := msgs[0].Context()
	var err error
	if tx, ok := p.db.(pgx.Tx); ok {
		err = p.ob.EnqueueTx(ctx, tx, rows...)
	} else {
		err = pgx.BeginFunc(ctx, p.db, func(tx pgx.Tx) error { return p.ob.EnqueueTx(ctx, tx, rows...) })
	}
	if err != nil {
		return fmt.Errorf("idemwatermill: publish to %s: %w", topic, err)
	}
	return nil
}

// Close makes later Publish calls fail; it does not touch the handle.
func (p *Publisher) Close() error {
	p.closed.Store(true)
	return nil
}
