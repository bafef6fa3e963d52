package console

import (
	"sync"
	"time"

	"github.com/idemq/idemq/outbox"
)

// The overview's rates need two observations of counters that only grow,
// and the outbox keeps none per destination: a published row is deleted,
// and nothing durable counts it. So the console keeps, in memory, a small
// ring of the gauges it read (one per page view or scrape of the overview,
// at most one per rateMinGap, for rateWindow), and derives:
//
//   - enqueued per minute: the movement of the outbox sequence's last value
//     (outbox.Gauges.Enqueued), for the whole outbox;
//   - drained per minute: enqueued minus the growth of the depth, for the
//     whole outbox: the rows that left it, published or dead-lettered.
//     Exact while the outbox holds at most outbox.GaugeSample rows at both
//     ends; above that the depths are the planner's estimates, and so is
//     this rate;
//   - per destination, the change of its depth per minute (negative: the
//     backlog shrinks), with the same caveat;
//   - per destination, dead letters per minute over the last rateWindow,
//     counted from the dead-letter table's failed_at index (not from the
//     ring: it is durable).
//
// The ring restarts with the process and is per console instance: a rate
// shows "-" until two observations rateMinGap apart exist.
const (
	rateWindow = 5 * time.Minute
	rateMax    = 64
)

// rateMinGap is the shortest span a rate is taken over (a variable for
// the tests).
var rateMinGap = 5 * time.Second

// rateSample is one observation of the gauges.
type rateSample struct {
	at       time.Time
	enqueued int64
	depth    int64
	exact    bool
	dest     map[string]int64
}

// rateRing is the observations of the last rateWindow, oldest first.
type rateRing struct {
	mu      sync.Mutex
	samples []rateSample
}

// Rates is what two observations give, per minute; Known is false until
// there are two.
type Rates struct {
	Known bool
	// Over is the span between the two observations.
	Over time.Duration
	// Exact is false when a depth of either observation was an estimate.
	Exact             bool
	EnqueuedPerMin    float64
	DrainedPerMin     float64
	DepthChangePerMin map[string]float64
}

// observe records g, read at now, and returns the rates between the
// oldest observation of the window and this one.
func (r *rateRing) observe(now time.Time, g outbox.Gauges) Rates {
	cur := rateSample{at: now, enqueued: g.Enqueued, depth: g.Depth, exact: g.Exact, dest: map[string]int64{}}
	for _, d := range g.Destinations {
		cur.dest[d.Destination] = d.Depth
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	keep := r.samples[:0]
	for _, s := range r.samples {
		if now.Sub(s.at) <= rateWindow && !s.at.After(now) {
			keep = append(keep, s)
		}
	}
	r.samples = keep
	if n := len(r.samples); n == 0 || now.Sub(r.samples[n-1].at) >= rateMinGap {
		r.samples = append(r.samples, cur)
		if len(r.samples) > rateMax {
			r.samples = r.samples[len(r.samples)-rateMax:]
		}
	}
	if len(r.samples) == 0 {
		return Rates{}
	}
	first := r.samples[0]
	span := now.Sub(first.at)
	if span < rateMinGap || cur.enqueued < first.enqueued {
		// Too close, or the sequence restarted (TRUNCATE ... RESTART
		// IDENTITY): no rate from this pair.
		return Rates{}
	}
	perMin := func(d float64) float64 { return d / span.Minutes() }
	rt := Rates{Known: true, Over: span, Exact: first.exact && cur.exact,
		EnqueuedPerMin:    perMin(float64(cur.enqueued - first.enqueued)),
		DepthChangePerMin: map[string]float64{}}
	rt.DrainedPerMin = max(perMin(float64(cur.enqueued-first.enqueued)-float64(cur.depth-first.depth)), 0)
	for dest, depth := range cur.dest {
		rt.DepthChangePerMin[dest] = perMin(float64(depth - first.dest[dest]))
	}
	for dest, depth := range first.dest {
		if _, ok := cur.dest[dest]; !ok {
			rt.DepthChangePerMin[dest] = perMin(float64(-depth))
		}
	}
	return rt
}
