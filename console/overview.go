package console

import (
	"fmt"
	"net/http"
	"sort"
	"time"

	"github.com/google/uuid"

	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/transports/webhook/endpoints"
)

// destinationRow is one row of the overview's destinations table.
type destinationRow struct {
	outbox.DestinationGauge
	// Parked is its rows parked behind a dead letter, counted exactly
	// (Outbox.Parked), where Held["parked"] counts the gauges' sample.
	Parked         int64
	FailedLastHour int64
	// DeadPerMin is its dead letters per minute over the last rateWindow;
	// DepthPerMin the change of its depth per minute, when Rates.Known.
	DeadPerMin, DepthPerMin float64
	// Why says why its rows do not move, when the console knows: a
	// webhook endpoint disabled or behind an open breaker.
	Why string
}

// attention is one thing on the overview that is stuck: what, why, since
// when, and what to do next.
type attention struct {
	What, Why, Next string
	Since           time.Time
	// Link is a console path that shows more.
	Link string
}

// partitionRow is one partition of the overview, flagged when a relay
// that is dead (or forgotten) still holds it.
type partitionRow struct {
	outbox.PartitionGauge
	DeadOwner bool
}

func (h *handler) overview(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	g, err := h.cfg.Outbox.Gauges(ctx)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	now := time.Now()
	failed, err := h.cfg.Outbox.DeadSince(ctx, now.Add(-time.Hour))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	rates := h.rates.observe(now, g)
	window, err := h.cfg.Outbox.DeadSince(ctx, now.Add(-rateWindow))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	parked, err := h.cfg.Outbox.Parked(ctx)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	eps := map[string]endpoints.Endpoint{}
	if h.cfg.Webhooks != nil {
		list, err := h.cfg.Webhooks.List(ctx)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		for _, ep := range list {
			eps[endpoints.DestinationPrefix+ep.ID] = ep
		}
	}
	rows := destinationRows(g, failed, window, parked, rates)
	var todo []attention
	for i, d := range rows {
		ep, ok := eps[d.Destination]
		switch {
		case !ok:
		case !ep.DisabledAt.IsZero():
			rows[i].Why = "endpoint " + ep.ID + " disabled: " + ep.DisabledReason
			todo = append(todo, attention{What: fmt.Sprintf("%s: webhook endpoint %s is disabled; its rows are held", d.Destination, ep.ID),
				Why: ep.DisabledReason, Since: ep.DisabledAt, Next: "fix the receiver, then enable the endpoint on the Webhooks page", Link: "/webhooks"})
		case ep.Breaker == endpoints.BreakerOpen || ep.Breaker == endpoints.BreakerHalfOpen:
			rows[i].Why = "endpoint " + ep.ID + " breaker " + string(ep.Breaker)
			todo = append(todo, attention{What: fmt.Sprintf("%s: webhook endpoint %s's breaker is %s; its rows wait for it", d.Destination, ep.ID, ep.Breaker),
				Why: "deliveries to " + ep.URL + " kept failing", Since: ep.BreakerSince, Next: "check the receiver; the breaker probes it by itself", Link: "/webhooks"})
		}
	}
	relays := map[uuid.UUID]outbox.RelayGauge{}
	liveRelays := 0
	for _, rl := range g.Relays {
		relays[rl.Owner] = rl
		if rl.Alive {
			liveRelays++
		}
	}
	var parts []partitionRow
	leased, deadHeld := 0, 0
	held := map[uuid.UUID]int{} // partitions per dead owner
	for _, p := range g.Partitions {
		row := partitionRow{PartitionGauge: p}
		if p.Owner != uuid.Nil {
			if relays[p.Owner].Alive {
				leased++
			} else {
				row.DeadOwner = true
				held[p.Owner]++
				deadHeld++
			}
		}
		if p.Cursor != 0 || row.DeadOwner {
			parts = append(parts, row)
		}
	}
	for owner, n := range held {
		todo = append(todo, attention{What: fmt.Sprintf("%d key partitions are held by dead relay %s", n, owner), Since: relays[owner].ExpiresAt,
			Why: "the relay stopped beating without releasing them", Next: "a live relay takes them over once their lease runs out; start one if none runs",
			Link: "/#partitions"})
	}
	todo = append(todo, stuck(g, rows, liveRelays)...)
	h.render(w, r, "overview", "Overview", map[string]any{"Gauges": g, "Destinations": rows, "Leased": leased, "DeadHeld": deadHeld,
		"Partitions": parts, "Sample": outbox.GaugeSample, "Rates": rates, "RateWindow": rateWindow, "Attention": todo})
}

// destinationRows joins the gauges' destinations with the dead letters of
// the last hour and of the rate window, the parked rows and the rates.
func destinationRows(g outbox.Gauges, failed, window, parked map[string]int64, rates Rates) []destinationRow {
	byName := map[string]*destinationRow{}
	row := func(dest string) *destinationRow {
		if r, ok := byName[dest]; ok {
			return r
		}
		r := &destinationRow{DestinationGauge: outbox.DestinationGauge{Destination: dest}}
		byName[dest] = r
		return r
	}
	for _, d := range g.Destinations {
		row(d.Destination).DestinationGauge = d
	}
	for dest, n := range failed { // failing destinations with no backlog too
		row(dest).FailedLastHour = n
	}
	for dest, n := range window {
		row(dest).DeadPerMin = float64(n) / rateWindow.Minutes()
	}
	for dest, n := range parked {
		row(dest).Parked = n
	}
	for dest, change := range rates.DepthChangePerMin { // drained empty in the window too
		row(dest).DepthPerMin = change
	}
	rows := make([]destinationRow, 0, len(byName))
	for _, r := range byName {
		rows = append(rows, *r)
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].Destination < rows[j].Destination })
	return rows
}

// stuck lists what the gauges show is stuck, beyond webhook eps and
// dead relays' partitions: no live relay, rows due for long, parked,
// unrouted, and destinations that dead-letter.
func stuck(g outbox.Gauges, rows []destinationRow, liveRelays int) []attention {
	var todo []attention
	if g.Depth > 0 && liveRelays == 0 {
		todo = append(todo, attention{What: fmt.Sprintf("no live relay: %s rows wait", num(g.Depth)), Since: time.Now().Add(-g.OldestAge),
			Why: "no relay worker has beaten within its lease", Next: "start a relay (idemq relay), or see why it stopped in its logs"})
	}
	for _, d := range rows {
		link := "/dead" + string(query("destination", d.Destination))
		if d.OldestDue > time.Minute {
			todo = append(todo, attention{What: fmt.Sprintf("%s: a row has been due for %s", d.Destination, human(d.OldestDue)),
				Since: time.Now().Add(-d.OldestDue), Why: "the relays do not keep up, or do not route it", Next: "check the relays' logs and routes"})
		}
		if d.Parked > 0 {
			todo = append(todo, attention{What: fmt.Sprintf("%s: %s rows parked behind dead letters of their keys", d.Destination, num(d.Parked)),
				Why: "an earlier message of each key is a dead letter", Next: "replay or purge those dead letters: their followers go on by themselves", Link: link})
		}
		if n := d.Held["no_route"]; n > 0 {
			todo = append(todo, attention{What: fmt.Sprintf("%s: rows with no route (%s among the oldest)", d.Destination, num(n)),
				Why: "no relay route matches the destination", Next: "add a route for it to the relays (idemq relay --route)"})
		}
		if d.FailedLastHour > 0 {
			todo = append(todo, attention{What: fmt.Sprintf("%s: %s dead letters in the last hour", d.Destination, num(d.FailedLastHour)),
				Why: "messages failed permanently or too often", Next: "see their causes; fix, then replay the group", Link: link})
		}
	}
	return todo
}
