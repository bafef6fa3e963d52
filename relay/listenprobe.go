package relay

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
)

// listenProbeTimeout is how long the listener waits for its own probe
// notification before it warns that LISTEN receives nothing.
const listenProbeTimeout = 10 * time.Second

// listenProbe checks that the listener's connection receives
// notifications: through a transaction-mode pooler (PgBouncer, Supavisor)
// LISTEN succeeds but nothing ever arrives, and the relay silently falls
// back to polling every PollInterval. Right after LISTEN the relay sends a
// notification with a payload of its own through the pool, as EnqueueTx
// does; if the listener has not seen it within listenProbeTimeout, it logs
// a warning that says what to configure.
type listenProbe struct {
	payload string
	seen    atomic.Bool
	timer   *time.Timer
}

// startListenProbe sends the probe and arms the warning; stop disarms it.
func (r *Relay) startListenProbe(ctx context.Context, channel string) *listenProbe {
	p := &listenProbe{payload: "idemq-listen-probe:" + uuid.NewString()}
	if _, err := r.pool.Exec(ctx, `SELECT pg_notify($1, $2)`, channel, p.payload); err != nil {
		r.log.Debug("relay: could not send the listener's probe notification", "err", err)
		return p
	}
	p.timer = time.AfterFunc(listenProbeTimeout, func() {
		if !p.seen.Load() && ctx.Err() == nil {
			r.log.Warn("relay: LISTEN receives no notifications (is the listen connection behind a transaction-mode pooler such as PgBouncer?); "+
				"the relay finds new messages by polling every PollInterval only: set ListenConnString (--listen-url) to a direct connection, or DisableListen (--poll-only)",
				"waited", listenProbeTimeout, "poll_interval", r.cfg.PollInterval)
		}
	})
	return p
}

// notified notes a notification's payload.
func (p *listenProbe) notified(payload string) {
	if payload == p.payload {
		p.seen.Store(true)
	}
}

func (p *listenProbe) stop() {
	if p.timer != nil {
		p.timer.Stop()
	}
}
