package relay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/relay"
)

// TestRelayMaintenanceRunsTheOutboxChoresAndTheExtraOnes: the relay's
// maintenance service holds the outbox's chores and those passed to it,
// and a pass runs each.
func TestRelayMaintenanceRunsTheOutboxChoresAndTheExtraOnes(t *testing.T) {
	b := setup(t)
	r, err := relay.New(b.pool, b.ob, &recorder{}, relay.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	m, err := r.Maintenance(idemq.Chore{Name: "inbox gc", Every: time.Minute, Run: func(context.Context) (int64, error) { runs++; return 2, nil }})
	if err != nil {
		t.Fatal(err)
	}
	res, err := m.RunOnce(context.Background())
	if err != nil || len(res) != 2 || !strings.HasPrefix(res[0].Name, "outbox classify ") || res[1].Done != 2 || runs != 1 {
		t.Fatalf("a pass of the relay's maintenance: %+v, %v (extra chore ran %d times); want the outbox's classify and the extra chore", res, err, runs)
	}
}
