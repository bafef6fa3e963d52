package main

import (
	"context"
	nethttp "net/http"
	"net/http/httptest"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/transports/webhook"
)

// webhookOutage is how many deliveries the partner's endpoint answers 503
// before it recovers: more than the Sink's breaker threshold, so the
// breaker opens, holds the endpoint's rows and probes it again.
const webhookOutage = 8

// webhookSinkConfig is the relay's webhook Sink configuration, the same in
// the parent and in the child relay.
func webhookSinkConfig() webhook.Config {
	return webhook.Config{
		// Only because the partner's receiver runs on loopback: the SSRF
		// guard refuses loopback, private and metadata addresses by default.
		AllowedNetworks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		// A short cooldown, so that the demo's outage ends within seconds.
		BreakerCooldown: 200 * time.Millisecond,
	}
}

// partner is the receiving side of the webhooks: a service built with the
// receiving middleware, which verifies the signature and applies each
// webhook-id once, in the transaction that records it in its inbox.
// Its first webhookOutage requests fail with 503, as an endpoint that is
// down and comes back.
type partner struct {
	srv   *httptest.Server
	calls atomic.Int64 // requests received
}

func startPartner(ctx context.Context, pool *pgxpool.Pool, secret string) (*partner, error) {
	c, err := consumer.New(pool, "webhook", webhook.Handle(func(ctx context.Context, tx pgx.Tx, d webhook.Delivery) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (consumer, msg_id, payload) VALUES ('webhook', $1, $2)`, d.ID, d.Body)
		return err
	}), consumer.Config{Redeliver: true, Inbox: inbox.Config{Schema: schema}})
	if err != nil {
		return nil, err
	}
	if err := c.Migrate(ctx); err != nil {
		return nil, err
	}
	apply, err := webhook.NewReceiver(c, webhook.ReceiverConfig{Keys: []string{secret}})
	if err != nil {
		return nil, err
	}
	p := &partner{}
	p.srv = httptest.NewServer(nethttp.HandlerFunc(func(w nethttp.ResponseWriter, r *nethttp.Request) {
		if p.calls.Add(1) <= webhookOutage {
			nethttp.Error(w, "partner down", nethttp.StatusServiceUnavailable)
			return
		}
		apply.ServeHTTP(w, r)
	}))
	return p, nil
}

// outage is the number of 503s the partner answered.
func (p *partner) outage() int { return int(min(p.calls.Load(), webhookOutage)) }
