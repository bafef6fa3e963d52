package idemwatermill

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/consumer"
)

// Middleware applies Watermill handlers once per message UUID through a
// consumer.Consumer: see [Middleware.Wrap].
type Middleware struct {
	c *consumer.Consumer
}

// NewMiddleware returns a Middleware recording the messages it applies in
// the inbox on pool under scope (the consumer's name: two scopes apply one
// message once each); cfg is the consumer's configuration, its retry
// policy and dead letters included. Call [Middleware.Migrate] once to
// create the inbox tables.
func NewMiddleware(pool *pgxpool.Pool, scope string, cfg consumer.Config) (*Middleware, error) {
	c, err := consumer.New(pool, scope, apply, cfg)
	if err != nil {
		return nil, err
	}
	return &Middleware{c: c}, nil
}

// Migrate creates or upgrades the inbox tables.
func (mw *Middleware) Migrate(ctx context.Context) error { return mw.c.Migrate(ctx) }

// Consumer returns the consumer that applies the messages, for its inbox
// (Store) and scope.
func (mw *Middleware) Consumer() *consumer.Consumer { return mw.c }

// call is one handler call in flight: the consumer's handler runs h on
// msg and keeps what it returned.
type call struct {
	h   message.HandlerFunc
	msg *message.Message
	out []*message.Message
}

type txKey struct{}

// Tx returns the transaction a handler wrapped by [Middleware.Wrap] runs
// in, from its message's context: write through it, and the writes commit
// if and only if the message is recorded as applied. It must not be
// committed or rolled back.
func Tx(ctx context.Context) (pgx.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(pgx.Tx)
	return tx, ok
}

func apply(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	c := m.Source.(*call)
	orig := c.msg.Context()
	c.msg.SetContext(context.WithValue(ctx, txKey{}, tx))
	defer c.msg.SetContext(orig)
	out, err := c.h(c.msg)
	c.out = out
	return err
}

// Wrap is a message.HandlerMiddleware: the wrapped handler runs inside the
// transaction that records msg.UUID in the inbox ([Tx] gives it), retried
// by the consumer's policy. Applied returns the handler's messages for the
// Router to publish; a duplicate (a redelivery of an applied message), a
// conflict (the UUID seen with another payload) and a dead letter return
// no message and no error, so the Router acks; a message to retry returns
// the error, so the Router nacks. The Router publishes the returned
// messages after the commit, at most once; messages that must leave
// exactly when the handler's writes commit go through NewPublisher on
// [Tx] instead.
func (mw *Middleware) Wrap(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		c := &call{h: h, msg: msg}
		r := mw.c.Process(msg.Context(), &consumer.Message{ID: msg.UUID, Payload: msg.Payload, Headers: msg.Metadata, Source: c})
		if r.Outcome == consumer.Retry {
			return nil, r.Err
		}
		if r.Outcome == consumer.Applied {
			return c.out, nil
		}
		return nil, nil
	}
}
