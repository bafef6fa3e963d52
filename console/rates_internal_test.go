package console

import (
	"testing"
	"time"

	"github.com/idemq/idemq/outbox"
)

// TestRateRing: rates come from the oldest observation of the window and
// the current one, per minute; none until two are far enough apart, none
// across a sequence restart, and observations older than the window go.
func TestRateRing(t *testing.T) {
	var r rateRing
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	gauges := func(enqueued, depth int64, exact bool, dest map[string]int64) outbox.Gauges {
		g := outbox.Gauges{Enqueued: enqueued, Depth: depth, Exact: exact}
		for d, n := range dest {
			g.Destinations = append(g.Destinations, outbox.DestinationGauge{Destination: d, Depth: n})
		}
		return g
	}
	if rt := r.observe(t0, gauges(100, 50, true, map[string]int64{"a": 30, "b": 20})); rt.Known {
		t.Fatalf("one observation gave %+v", rt)
	}
	if rt := r.observe(t0.Add(rateMinGap/2), gauges(100, 50, true, nil)); rt.Known {
		t.Fatalf("two observations closer than rateMinGap gave %+v", rt)
	}
	// Two minutes later: 200 enqueued, depth 50 -> 10 (a: 10, b gone).
	rt := r.observe(t0.Add(2*time.Minute), gauges(300, 10, true, map[string]int64{"a": 10}))
	if !rt.Known || !rt.Exact || rt.Over != 2*time.Minute || rt.EnqueuedPerMin != 100 || rt.DrainedPerMin != 120 ||
		rt.DepthChangePerMin["a"] != -10 || rt.DepthChangePerMin["b"] != -10 {
		t.Fatalf("rates = %+v; want 100 enqueued/min, 120 drained/min, a and b -10/min", rt)
	}
	// An estimated depth makes the rates inexact.
	if rt := r.observe(t0.Add(3*time.Minute), gauges(400, 5000, false, nil)); !rt.Known || rt.Exact {
		t.Fatalf("rates with an estimate = %+v, want Known and not Exact", rt)
	}
	// Past the window the first observations are dropped.
	rt = r.observe(t0.Add(7*time.Minute), gauges(500, 0, true, nil))
	if !rt.Known || rt.Over != 5*time.Minute {
		t.Fatalf("rates after the window = %+v, want them over the 5 minutes since the 2-minute observation", rt)
	}
	// A restarted sequence gives no rate.
	if rt := r.observe(t0.Add(8*time.Minute), gauges(3, 0, true, nil)); rt.Known {
		t.Fatalf("rates across a sequence restart = %+v", rt)
	}
}
