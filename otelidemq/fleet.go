package otelidemq

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/idemq/idemq/internal/nilcheck"
	"github.com/idemq/idemq/relay"
)

// Attribute keys of the fleet gauges.
var (
	keyFleetState    = attribute.Key("idemq.fleet.state")
	keyFleetDatabase = attribute.Key("idemq.fleet.database")
)

// FleetTopFailing is how many failing databases the fleet gauges name one
// by one; the rest are counted per server only, so a thousand tenants do
// not make a thousand series.
const FleetTopFailing = 10

// ObserveFleet reports the state of f's databases at every collection,
// per server so that the series stay few however many databases:
//
//   - idemq.fleet.databases {server.address, idemq.fleet.state}: databases
//     draining, idle and failing;
//   - idemq.fleet.connections {server.address}: connections the fleet
//     holds on the server (its budget: relay.FleetConfig.ConnsPerServer);
//   - idemq.fleet.published {server.address}: rows published from the
//     server's databases since the start;
//   - idemq.fleet.failing.duration {idemq.fleet.database, server.address}:
//     how long each of the FleetTopFailing longest-failing databases has
//     been failing (s).
func (t *Telemetry) ObserveFleet(f *relay.Fleet) (metric.Registration, error) {
	if nilcheck.IsNil(f) {
		return nil, errors.New("otelidemq: ObserveFleet: nil fleet")
	}
	b := builder{m: t.meter}
	databases := b.observable("idemq.fleet.databases", "{database}", "Databases of the relay fleet per server, by state.")
	conns := b.observable("idemq.fleet.connections", "{connection}", "Connections the relay fleet holds on a server.")
	published := b.observable("idemq.fleet.published", "{message}", "Rows published from a server's databases since the start.")
	failing := b.observableFloat("idemq.fleet.failing.duration", "s", "How long a database of the relay fleet has been failing.")
	if b.err != nil {
		return nil, b.err
	}
	return t.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		type count struct{ draining, idle, failing, published int64 }
		servers := map[string]*count{}
		var failed []relay.FleetDatabase
		for _, d := range f.Databases() {
			c := servers[d.Server]
			if c == nil {
				c = &count{}
				servers[d.Server] = c
			}
			c.published += d.Published
			switch {
			case d.Err != nil:
				c.failing++
				failed = append(failed, d)
			case d.Draining:
				c.draining++
			default:
				c.idle++
			}
		}
		for server, c := range servers {
			at := semconv.ServerAddress(server)
			for state, n := range map[string]int64{"draining": c.draining, "idle": c.idle, "failing": c.failing} {
				o.ObserveInt64(databases, n, metric.WithAttributes(at, keyFleetState.String(state)))
			}
			o.ObserveInt64(conns, int64(f.Budget().InUse(server)), metric.WithAttributes(at))
			o.ObserveInt64(published, c.published, metric.WithAttributes(at))
		}
		slices.SortFunc(failed, func(a, b relay.FleetDatabase) int {
			return cmp.Or(a.Since.Compare(b.Since), cmp.Compare(a.Name, b.Name))
		})
		for _, d := range failed[:min(len(failed), FleetTopFailing)] {
			o.ObserveFloat64(failing, time.Since(d.Since).Seconds(), metric.WithAttributes(keyFleetDatabase.String(d.Name), semconv.ServerAddress(d.Server)))
		}
		return nil
	}, databases, conns, published, failing)
}
