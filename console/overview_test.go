package console_test

import (
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/idemq/idemq/console"
	"github.com/idemq/idemq/transports/webhook/endpoints"
)

// TestOverviewSaysWhatIsStuck: the overview's first screen lists what is
// stuck, why, since when and what to do: a destination whose webhook
// endpoint is disabled (with the reason, on its row too), rows parked
// behind dead letters counted exactly (1,200 of them behind 250 others,
// where the gauges' 200-row sample sees none), and partitions a dead relay
// holds (flagged in the partitions table); numbers have thousands
// separators and ages read as people read them. An idle console says that
// nothing is stuck and that its tables are empty.
func TestOverviewSaysWhatIsStuck(t *testing.T) {
	t.Parallel()
	e := setup(t, console.Config{User: user, Password: password})
	c := e.as(t, basic)
	_, idle := c.get("/")
	for _, want := range []string{`id="no-attention"`, `id="no-relays"`, `id="no-partitions"`, `id="empty"`} {
		if !strings.Contains(idle, want) {
			t.Errorf("the idle overview lacks %s:\n%s", want, idle)
		}
	}

	if _, err := e.webhooks.Add(e.ctx, endpoints.Endpoint{ID: "ep-1", URL: "https://hooks.example/in", Keys: []string{secret}}); err != nil {
		t.Fatal(err)
	}
	if err := e.webhooks.Disable(e.ctx, "ep-1", "410 Gone from the receiver"); err != nil {
		t.Fatal(err)
	}
	e.enqueue(t, endpoints.DestinationPrefix+"ep-1", 3)
	e.enqueue(t, "orders", 250)
	parked := e.enqueue(t, "billing", 1200)
	if _, err := e.pool.Exec(e.ctx, `UPDATE idemq_outbox SET available_at = 'infinity' WHERE id = ANY($1::uuid[])`, parked); err != nil {
		t.Fatal(err)
	}
	dead := uuid.New()
	if _, err := e.pool.Exec(e.ctx, `INSERT INTO idemq_outbox_relays (owner, expires_at) VALUES ($1, now() - interval '3 hours 5 minutes')`, dead); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(e.ctx, `UPDATE idemq_outbox_lease SET owner = $1, token = 7 WHERE part < 5`, dead); err != nil {
		t.Fatal(err)
	}

	code, page := c.get("/")
	if code != http.StatusOK {
		t.Fatalf("GET /: %d\n%s", code, page)
	}
	attention := between(page, `<table id="attention">`, "</table>")
	for _, want := range []string{
		"webhook endpoint ep-1 is disabled", "410 Gone from the receiver", "enable the endpoint",
		"billing: 1,200 rows parked behind dead letters", "replay or purge",
		fmt.Sprintf("5 key partitions are held by dead relay %s", dead), "3 h 5 min ago",
		"no live relay: 1,453 rows wait",
	} {
		if !strings.Contains(attention, want) {
			t.Errorf("the attention table lacks %q:\n%s", want, attention)
		}
	}
	if strings.Index(page, `id="attention"`) > strings.Index(page, `id="destinations"`) {
		t.Error("what is stuck comes after the destinations table, not first")
	}
	if row := between(page, `dead?destination=webhook%2Fep-1">webhook/ep-1</a>`, "</tr>"); !strings.Contains(row, "endpoint ep-1 disabled: 410 Gone from the receiver") {
		t.Errorf("the endpoint's row does not say why: %q", row)
	}
	if row := between(page, `dead?destination=billing">billing</a>`, "</tr>"); !strings.Contains(row, `<td class="n bad">1,200</td>`) {
		t.Errorf("billing's row does not count its 1,200 parked rows: %q", row)
	}
	if !strings.Contains(page, `id="depth">1,453<`) {
		t.Errorf("the depth card lacks its thousands separator:\n%s", between(page, `id="depth"`, "</div>"))
	}
	if !strings.Contains(page, `<span class="bad" id="dead-held">5 held by dead relays</span>`) || strings.Count(page, "data-dead-owner") != 5 {
		t.Errorf("the partitions held by the dead relay are not flagged:\n%s", between(page, `id="partitions"`, "</table>"))
	}
	if goDuration := regexp.MustCompile(`\d+h\d+m|\d+m\d+(\.\d+)?s`).FindString(page); goDuration != "" {
		t.Errorf("the overview shows a Go duration %q", goDuration)
	}
}
