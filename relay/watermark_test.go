package relay_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/relay"
)

// watermarker is a recorder that claims, per partition, to have committed
// the seqs in marks already.
type watermarker struct {
	recorder
	marks map[int][]int64
	mu    sync.Mutex
	asked map[int]int // partition -> Watermark calls
}

func (w *watermarker) Watermark(_ context.Context, partition int, token int64) (relay.Watermark, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.asked[partition]++
	return relay.Watermark{Partition: partition, Token: token - 1, Seqs: w.marks[partition]}, nil
}

// A relay whose Sink (here behind a Router) is a Watermarker deletes the
// rows a partition's watermark names when it takes the partition, without
// publishing them, and publishes the rest in order; a failed publish makes
// it ask again before the partition's next batch.
func TestWatermarkerRowsDeletedUnpublished(t *testing.T) {
	t.Parallel()
	b := setup(t)
	enqueue(t, b, keyed("d", 200, 10, 0)...)
	// The first 5 messages of every key were committed by the sink's last
	// transactions.
	rows, err := b.pool.Query(b.ctx, `SELECT coalesce(mod(hashtext(key)::int8 + 2147483648, 64)::int4, -1), seq, convert_from(payload, 'UTF8') FROM `+b.table())
	if err != nil {
		t.Fatal(err)
	}
	marks := map[int][]int64{}
	for rows.Next() {
		var part int
		var seq int64
		var payload string
		if err := rows.Scan(&part, &seq, &payload); err != nil {
			t.Fatal(err)
		}
		var key string
		var i int
		if _, err := fmt.Sscanf(strings.Replace(payload, ":", " ", 1), "%s %d", &key, &i); err != nil {
			t.Fatal(err)
		}
		if i < 5 {
			marks[part] = append(marks[part], seq)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	sink := &watermarker{marks: marks, asked: map[int]int{}}
	failOnce := sync.Once{}
	sink.fn = func(call int, batch []relay.Message) error {
		var err error
		failOnce.Do(func() { err = fmt.Errorf("broker error") })
		return err
	}
	router := relay.NewRouter()
	if err := router.Route("d", sink); err != nil {
		t.Fatal(err)
	}
	run(t, newRelay(t, b, router, relay.Config{BatchSize: 50}))
	idemqtest.WaitFor(t, "an empty outbox", func() bool { return pending(t, b) == 0 })

	next := map[string]int{}
	for _, m := range sink.deliveries() {
		key, num, _ := strings.Cut(string(m.Payload), ":")
		var i int
		fmt.Sscan(num, &i)
		if want := max(next[key], 5); i != want {
			t.Fatalf("key %s: delivered %d where %d was due (0-4 are the watermark's)", key, i, want)
		}
		next[key] = i + 1
	}
	if got := len(sink.deliveries()); got != 150 {
		t.Fatalf("%d deliveries, want the 150 rows the watermarks do not name", got)
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if len(sink.asked) != 64 {
		t.Fatalf("asked for the watermarks of %d partitions, want all 64", len(sink.asked))
	}
	again := 0
	for _, n := range sink.asked {
		if n > 1 {
			again++
		}
	}
	if again == 0 {
		t.Fatal("no watermark asked for again after the failed publish")
	}
}
