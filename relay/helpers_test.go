package relay_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
)

type bundle struct {
	ctx  context.Context
	pool *pgxpool.Pool
	ob   *outbox.Outbox
}

func setup(t testing.TB) bundle {
	t.Helper()
	return setupOn(t, testenv.Postgres(t))
}

var quiet = slog.New(slog.NewTextHandler(logOut(), nil))

func logOut() io.Writer {
	if os.Getenv("RELAY_TEST_LOG") != "" {
		return os.Stderr
	}
	return io.Discard
}

// recorder is a Sink that records every delivery; fn, if set, decides the
// outcome of each call (and may record only part of the batch).
type recorder struct {
	mu    sync.Mutex
	got   []relay.Message
	calls int
	fn    func(call int, batch []relay.Message) error
}

func (r *recorder) Publish(ctx context.Context, _ relay.BatchID, batch []relay.Message) error {
	r.mu.Lock()
	r.calls++
	call := r.calls
	fn := r.fn
	r.mu.Unlock()
	var err error
	if fn != nil {
		err = fn(call, batch)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	failed := map[int]error{}
	if pe, ok := err.(*relay.PublishError); ok {
		failed = pe.Failed
	} else if err != nil {
		return err
	}
	for i, m := range batch {
		if failed[i] == nil {
			r.got = append(r.got, m)
		}
	}
	return err
}

func (r *recorder) deliveries() []relay.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]relay.Message(nil), r.got...)
}

// distinct counts distinct delivered ids across recorders.
func distinct(recs ...*recorder) int {
	seen := map[string]bool{}
	for _, r := range recs {
		for _, m := range r.deliveries() {
			seen[m.ID.String()] = true
		}
	}
	return len(seen)
}

// enqueue writes n messages per call of gen in one transaction.
func enqueue(t testing.TB, b bundle, msgs ...outbox.Message) {
	t.Helper()
	if err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error { return b.ob.EnqueueTx(b.ctx, tx, msgs...) }); err != nil {
		t.Fatal(err)
	}
}

// keyed returns n messages "key:i" for keys k0..k(keys-1), round robin.
func keyed(dest string, n, keys, from int) []outbox.Message {
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		k := fmt.Sprint("k", (from+i)%keys)
		msgs[i] = outbox.Message{Destination: dest, Key: k, Payload: fmt.Appendf(nil, "%s:%d", k, (from+i)/keys)}
	}
	return msgs
}

// checkOrder verifies that, per key, every delivery of message i came after
// a delivery of every message before i (payload "key:i"), and returns the
// number of redeliveries.
func checkOrder(t *testing.T, deliveries []relay.Message) (dups int) {
	t.Helper()
	next := map[string]int{}
	for _, m := range deliveries {
		k, n, ok := strings.Cut(string(m.Payload), ":")
		if !ok {
			continue
		}
		i, _ := strconv.Atoi(n)
		switch {
		case i == next[k]:
			next[k]++
		case i < next[k]:
			dups++
		default:
			t.Fatalf("key %s: message %d delivered before message %d", k, i, next[k])
		}
	}
	return dups
}

// run starts r, waits until it is ready and returns a function that stops
// it and waits for Run to return.
func run(t testing.TB, r *relay.Relay) (stop func()) {
	t.Helper()
	running, err := idemq.Start(context.Background(), r)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			if err := running.Stop(); err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func newRelay(t testing.TB, b bundle, sink relay.Sink, cfg relay.Config) *relay.Relay {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	r, err := relay.New(b.pool, b.ob, sink, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func pending(t testing.TB, b bundle) int64 {
	t.Helper()
	st, err := b.ob.Stats(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st.Pending
}

// table is the quoted outbox table.
func (b bundle) table() string {
	c := b.ob.Config()
	return pgx.Identifier{c.Schema, c.Table}.Sanitize()
}
