package otelidemq

import (
	"context"
	"errors"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/idemq/idemq/internal/nilcheck"
	"github.com/idemq/idemq/outbox"
)

// Attribute keys of the backlog gauges.
var (
	keyPartition = attribute.Key("idemq.outbox.partition")
	keyOwner     = attribute.Key("idemq.relay.owner")
	keyExact     = attribute.Key("idemq.exact")
)

// GaugeTimeout bounds one read of the gauges during a collection: a
// scrape that waits on a stuck database gets no backlog gauges, not a
// hung scrape.
const GaugeTimeout = 2 * time.Second

// ObserveOutbox reports ob's backlog gauges ([outbox.Outbox.Gauges]) at
// every collection (each Prometheus scrape, each OTLP export), read from
// index edges, never by counting the outbox:
//
//   - idemq.outbox.depth {messaging.destination.name, idemq.exact}: rows
//     per destination, exact or estimated;
//   - idemq.outbox.oldest_due.age {messaging.destination.name}: how long
//     the longest-due row has been due (s);
//   - idemq.outbox.held {messaging.destination.name, idemq.relay.hold_reason}:
//     rows not due, by reason (parked, no_route, waiting);
//   - idemq.outbox.partition.lag, .cursor, .token {idemq.outbox.partition,
//     idemq.relay.owner}: each partition's oldest row's age (s), its seq,
//     and the lease's fencing token;
//   - idemq.relay.liveness.remaining {idemq.relay.owner}: seconds until a
//     relay worker's liveness runs out (negative: dead, not yet forgotten).
//
// Unregister the returned registration to stop. A failed read reports
// nothing for that collection.
func (t *Telemetry) ObserveOutbox(ob *outbox.Outbox) (metric.Registration, error) {
	if nilcheck.IsNil(ob) {
		return nil, errors.New("otelidemq: ObserveOutbox: nil outbox")
	}
	m := t.meter
	b := builder{m: m}
	depth := b.observable("idemq.outbox.depth", "{message}", "Rows waiting in the outbox per destination (estimated above outbox.GaugeSample rows).")
	due := b.observableFloat("idemq.outbox.oldest_due.age", "s", "How long the longest-due row of a destination has been due.")
	held := b.observable("idemq.outbox.held", "{message}", "Rows of a destination not due, by reason.")
	lag := b.observableFloat("idemq.outbox.partition.lag", "s", "Age of the oldest row of a key partition.")
	cursor := b.observable("idemq.outbox.partition.cursor", "{seq}", "Seq of the oldest row of a key partition (0: empty).")
	token := b.observable("idemq.outbox.partition.token", "{token}", "Fencing token of a key partition's lease.")
	live := b.observableFloat("idemq.relay.liveness.remaining", "s", "Seconds until a relay worker's liveness runs out.")
	if b.err != nil {
		return nil, b.err
	}
	return m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, GaugeTimeout)
		defer cancel()
		g, err := ob.Gauges(ctx)
		if err != nil {
			return err
		}
		exact := keyExact.Bool(g.Exact)
		for _, d := range g.Destinations {
			dest := semconv.MessagingDestinationName(d.Destination)
			o.ObserveInt64(depth, d.Depth, metric.WithAttributes(dest, exact))
			o.ObserveFloat64(due, d.OldestDue.Seconds(), metric.WithAttributes(dest))
			for reason, n := range d.Held {
				o.ObserveInt64(held, n, metric.WithAttributes(dest, keyReason.String(reason)))
			}
		}
		for _, p := range g.Partitions {
			attrs := metric.WithAttributes(keyPartition.String(strconv.Itoa(p.Partition)), keyOwner.String(ownerName(p.Owner.String())))
			o.ObserveFloat64(lag, p.Lag.Seconds(), attrs)
			o.ObserveInt64(cursor, p.Cursor, attrs)
			o.ObserveInt64(token, p.Token, attrs)
		}
		for _, r := range g.Relays {
			o.ObserveFloat64(live, time.Until(r.ExpiresAt).Seconds(), metric.WithAttributes(keyOwner.String(r.Owner.String())))
		}
		return nil
	}, depth, due, held, lag, cursor, token, live)
}

// ownerName is a partition owner's label: "" for nobody.
func ownerName(id string) string {
	if id == "00000000-0000-0000-0000-000000000000" {
		return ""
	}
	return id
}

func (b *builder) observable(name, unit, desc string) metric.Int64ObservableGauge {
	g, err := b.m.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
	b.keep(err)
	return g
}

func (b *builder) observableFloat(name, unit, desc string) metric.Float64ObservableGauge {
	g, err := b.m.Float64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
	b.keep(err)
	return g
}
