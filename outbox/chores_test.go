package outbox_test

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/outbox"
)

// TestChoresClassifyDeadLetters: the outbox's maintenance classifies the
// dead letters buried without a class, all of them in one round.
func TestChoresClassifyDeadLetters(t *testing.T) {
	b := setup(t, outbox.Config{})
	var msgs []outbox.Message
	for i := range 3 {
		msgs = append(msgs, outbox.Message{Destination: "hooks", Key: fmt.Sprintf("o-%d", i), Payload: fmt.Appendf(nil, "p%d", i)})
	}
	if err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error { return b.ob.EnqueueTx(b.ctx, tx, msgs...) }); err != nil {
		t.Fatal(err)
	}
	kill(t, b, "dial tcp 10.0.0.7:443: connection refused", "p0", "p1", "p2")
	m, err := idemq.NewMaintenance(nil, b.ob.Chores()...)
	if err != nil {
		t.Fatal(err)
	}
	res, err := m.RunOnce(b.ctx)
	if err != nil || len(res) != 1 || res[0].Done != 3 {
		t.Fatalf("a round of the outbox's chores: %+v, %v; want 3 dead letters classified", res, err)
	}
	groups, err := b.ob.DeadGroups(b.ctx, outbox.DeadFilter{})
	if err != nil || len(groups) != 1 || groups[0].Class != "dial tcp <addr>: connection refused" || groups[0].Count != 3 {
		t.Fatalf("groups after the chore: %+v, %v; want one classified group of 3", groups, err)
	}
}
