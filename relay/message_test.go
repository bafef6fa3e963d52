package relay_test

import (
	"testing"

	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
)

// TestMessageCarriesSeqPartitionAndLeaseToken checks what a Sink learns
// about each message besides the enqueued one: its outbox seq (a key's
// messages in seq order), its key partition as Postgres hashes it, and the
// fencing token of the lease the relay held on that partition; an unkeyed
// message has partition -1 and no token.
func TestMessageCarriesSeqPartitionAndLeaseToken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	enqueue(t, b, outbox.Message{Destination: "d", Key: "a", Payload: []byte("a:0")},
		outbox.Message{Destination: "d", Key: "b", Payload: []byte("b:0")},
		outbox.Message{Destination: "d", Payload: []byte("none")},
		outbox.Message{Destination: "d", Key: "a", Payload: []byte("a:1")})
	rec := &recorder{}
	run(t, newRelay(t, b, rec, relay.Config{}))
	idemqtest.WaitFor(t, "4 deliveries", func() bool { return distinct(rec) == 4 })

	seqs := map[string]int64{}
	for _, m := range rec.deliveries() {
		seqs[string(m.Payload)] = m.Seq
		if m.Key == "" {
			if m.Partition != -1 || m.LeaseToken != 0 {
				t.Errorf("unkeyed message: partition %d, token %d; want -1 and 0", m.Partition, m.LeaseToken)
			}
			continue
		}
		var part int
		var token int64
		if err := b.pool.QueryRow(b.ctx, `SELECT l.part, l.token FROM idemq_outbox_lease AS l
WHERE l.part = mod(hashtext($1)::int8 + 2147483648, 64)::int4`, m.Key).Scan(&part, &token); err != nil {
			t.Fatal(err)
		}
		if m.Partition != part || m.LeaseToken != token || token == 0 {
			t.Errorf("key %s: partition %d, token %d; want the lease's %d and %d (not 0)", m.Key, m.Partition, m.LeaseToken, part, token)
		}
	}
	if !(0 < seqs["a:0"] && seqs["a:0"] < seqs["b:0"] && seqs["b:0"] < seqs["none"] && seqs["none"] < seqs["a:1"]) {
		t.Errorf("seqs %v, want increasing in enqueue order", seqs)
	}
}
