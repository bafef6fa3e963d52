package transporttest

import (
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/testenv"
)

// outageLasts is how long DatabaseOutage keeps the database away: long
// enough for a subscriber to fail what it holds and back off a few
// times, short enough for make test. It is the fault's length, not a
// timing assertion.
const outageLasts = 2 * time.Second

// databaseOutage: with a backlog on the subscriber, the database goes
// away (every connection cut, new ones refused, as when the PgBouncer in
// front of it dies) and comes back a few seconds later. Every message is
// applied once and in its key's order: a message that could not be
// applied holds back those behind it rather than being redelivered at
// once. The subscriber says once that the database went and once that it
// is back, and no other line at Warn level or above: no line per retried
// message.
func databaseOutage(fx *fixture) {
	if !fx.f.OrderedPerKey {
		fx.t.Skip("the transport does not keep per-key order (Features.OrderedPerKey is false)")
	}
	pool, proxy := testenv.PostgresBehindProxy(fx.t)
	fx.pool, fx.fx = pool, idemqtest.NewEffects(fx.t, pool)
	var logs testenv.Logs
	fx.logger = logs.Logger()
	cut := make(chan struct{})
	var applied atomic.Int32
	fx.onResult = func(r consumer.Result) {
		if r.Outcome == consumer.Applied && applied.Add(1) == 10 {
			proxy.Cut() // before the next message: the backlog meets the outage
			close(cut)
		}
	}
	msgs := messages(300, 5, "outage")
	fx.subscribe(fx.consumer("orders"), fx.group("g"), nil)
	fx.publish(msgs...)
	select {
	case <-cut:
	case <-time.After(waitTimeout):
		fx.t.Fatalf("transporttest: 10 messages not applied within %v, only %d", waitTimeout, applied.Load())
	}
	time.Sleep(outageLasts)
	proxy.Restore()
	// Effects, not Applied outcomes: a commit cut by the outage may have
	// gone through while the consumer saw it fail, and the redelivery is
	// then a Duplicate.
	fx.waitFor("every message applied", func() bool { return len(fx.effects()) >= len(msgs) })
	fx.inKeyOrder(msgs)
	fx.appliedOnce(ids(msgs))

	const wentAway = "idemq: database unavailable"
	gone, back := logs.Records(wentAway), logs.Records("idemq: database available again")
	if len(gone) != 1 || len(back) != 1 {
		fx.t.Errorf("%d lines saying the database went and %d saying it is back, want one each: %+v %+v", len(gone), len(back), gone, back)
	}
	var loud []string
	for _, r := range logs.Records("") {
		if r.Level >= slog.LevelWarn && !strings.HasPrefix(r.Msg, wentAway) {
			loud = append(loud, r.Msg)
		}
	}
	if len(loud) > 0 {
		fx.t.Errorf("%d more lines at Warn or above during the outage, want none: %q", len(loud), loud)
	}
}

// DatabaseOutage runs the DatabaseOutage scenario of [Run] alone, message
// by message, for a transport that cannot run the whole suite (core NATS,
// which loses what is published before a subscription exists). h must
// declare Features.OrderedPerKey.
func DatabaseOutage(t *testing.T, h Harness) {
	databaseOutage(newFixture(t, h, mode{name: "PerMessage"}))
}
