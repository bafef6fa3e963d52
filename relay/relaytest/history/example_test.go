package history_test

import (
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/idemq/idemq/relay/relaytest/history"
)

// A relay took over partition 7 (token 2 -> 3) while the old owner was
// still publishing: the new owner published key "order-1"'s second
// message before the old owner published its first.
func ExampleCheck() {
	at := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	first := history.Row{ID: uuid.MustParse("01900000-0000-7000-8000-000000000001"), Key: "order-1", Destination: "orders", Seq: 1}
	second := history.Row{ID: uuid.MustParse("01900000-0000-7000-8000-000000000002"), Key: "order-1", Destination: "orders", Seq: 2}
	published := func(r history.Row, relay string, token int64, ms int) history.Publish {
		return history.Publish{ID: r.ID, Key: r.Key, Destination: r.Destination, Seq: r.Seq,
			Relay: relay, Partition: 7, LeaseToken: token, At: at.Add(time.Duration(ms) * time.Millisecond)}
	}
	report, err := history.Check(history.History{
		Enqueued:  []history.Row{first, second},
		Published: []history.Publish{published(second, "relay-b", 3, 10), published(first, "relay-a", 2, 20)},
	}, history.Rules{})
	if err != nil {
		panic(err)
	}
	fmt.Println(report)
	// Output:
	// history: 2 rows enqueued, 2 published (2 publishes, 0 duplicates), 0 rejections, 0 purged; 2 violations (reordered 1, stale owner 1)
	//   reordered: key "order-1": seq 2 (id 01900000-0000-7000-8000-000000000002) first published at 12:00:00.010000 by relay-b (partition 7, token 3) while seq 1 (id 01900000-0000-7000-8000-000000000001), earlier in seq, still held the key: first published at 12:00:00.020000 by relay-a (partition 7, token 2)
	//   stale owner: partition 7: relay-a under token 2 published key "order-1" seq 1 (id 01900000-0000-7000-8000-000000000001) at 12:00:00.020000, after relay-b under token 3 first published key "order-1" seq 2 (id 01900000-0000-7000-8000-000000000002) at 12:00:00.010000
}
