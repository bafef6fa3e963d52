package outbox_test

import (
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/outbox"
)

// TestGauges: on a small outbox every figure is exact: depth per
// destination, rows held by reason, the partitions' cursors (their oldest
// seq) and owners, the relays' liveness.
func TestGauges(t *testing.T) {
	b := setup(t, outbox.Config{})
	g, err := b.ob.Gauges(b.ctx)
	if err != nil || g.Depth != 0 || !g.Exact || len(g.Destinations) != 0 || len(g.Partitions) != 65 || g.OldestAge != 0 || g.Enqueued != 0 {
		t.Fatalf("empty outbox: %+v, %v", g, err)
	}
	var msgs []outbox.Message
	for i := range 30 {
		m := outbox.Message{Destination: "orders", Key: fmt.Sprint("k", i%3), Payload: []byte("x")}
		if i%10 == 9 {
			m = outbox.Message{Destination: "hooks", Payload: []byte("y")}
		}
		msgs = append(msgs, m)
	}
	if err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error { return b.ob.EnqueueTx(b.ctx, tx, msgs...) }); err != nil {
		t.Fatal(err)
	}
	owner := uuid.New()
	if _, err := b.pool.Exec(b.ctx, `
UPDATE `+b.table()+` SET available_at = 'infinity' WHERE key = 'k0';
UPDATE `+b.table()+` SET available_at = now() + interval '1 hour', last_error = 'relay: no sink for destination "hooks"' WHERE destination = 'hooks';
INSERT INTO idemq_outbox_relays (owner, expires_at) VALUES ('`+owner.String()+`', now() + interval '1 minute');
UPDATE idemq_outbox_lease SET owner = '`+owner.String()+`', token = 7`); err != nil {
		t.Fatal(err)
	}
	g, err = b.ob.Gauges(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if g.Enqueued != 30 {
		t.Errorf("Enqueued = %d after 30 enqueues, want 30", g.Enqueued)
	}
	if g.Depth != 30 || !g.Exact || g.OldestAge <= 0 || len(g.Destinations) != 2 {
		t.Fatalf("gauges %+v", g)
	}
	hooks, orders := g.Destinations[0], g.Destinations[1]
	if hooks.Destination != "hooks" || hooks.Depth != 3 || hooks.Held["no_route"] != 3 || hooks.OldestDue != 0 {
		t.Errorf("hooks %+v", hooks)
	}
	if orders.Destination != "orders" || orders.Depth != 27 || orders.Held["parked"] != 9 || orders.OldestDue <= 0 {
		t.Errorf("orders %+v", orders)
	}
	var keyed int
	for _, p := range g.Partitions {
		if p.Partition >= 0 && (p.Owner != owner || p.Token != 7) {
			t.Errorf("partition %+v, want owner %s token 7", p, owner)
		}
		if p.Cursor > 0 && p.Lag <= 0 {
			t.Errorf("partition %+v: a cursor but no lag", p)
		}
		if p.Partition == -1 && (p.Owner != uuid.Nil || p.Cursor == 0) {
			t.Errorf("unkeyed rows %+v", p)
		}
		if p.Partition >= 0 && p.Cursor > 0 {
			keyed++
		}
	}
	if keyed == 0 || keyed > 3 {
		t.Errorf("%d keyed partitions with rows; want 1 to 3", keyed)
	}
	if len(g.Relays) != 1 || g.Relays[0].Owner != owner || !g.Relays[0].Alive {
		t.Errorf("relays %+v", g.Relays)
	}
}

// TestPendingByKey: a key's pending messages in order, parked ones marked.
func TestPendingByKey(t *testing.T) {
	b := setup(t, outbox.Config{})
	if err := b.ob.Enqueue(b.ctx, outbox.Message{Destination: "a", Key: "k", Payload: []byte("1")},
		outbox.Message{Destination: "b", Key: "k", Payload: []byte("2")}, outbox.Message{Destination: "a", Key: "other", Payload: []byte("3")}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `UPDATE `+b.table()+` SET available_at = 'infinity' WHERE destination = 'b'`); err != nil {
		t.Fatal(err)
	}
	got, err := b.ob.PendingByKey(b.ctx, "k", 0)
	if err != nil || len(got) != 2 || got[0].Destination != "a" || got[0].Parked || !got[1].Parked || got[1].Destination != "b" {
		t.Fatalf("PendingByKey: %+v, %v", got, err)
	}
}
