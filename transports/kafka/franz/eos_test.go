package franz_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemq/idemq/internal/lifecycle"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/relay/relaytest"
	"github.com/idemq/idemq/testenv"
	idemqkafka "github.com/idemq/idemq/transports/kafka"
	"github.com/idemq/idemq/transports/kafka/franz"
)

// The environment of the exactly-once kill test: its size (defaults: 5,000
// messages, 10 kills, for make test; make soak runs 100,000 and 100). The
// relay child processes get what to run as their relaytest.ChildArgs:
// sink kind|db url|brokers|topics|watermark topic|prefix.
const (
	eosMessagesEnv = "IDEMQ_KAFKA_EOS_MESSAGES"
	eosKillsEnv    = "IDEMQ_KAFKA_EOS_KILLS"
	eosAppName     = "idemq-eos-relay"
)

func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive number", name, v)
	}
	return n
}

// TestExactlyOnceKilledRelays runs relay child processes (this test binary
// re-executed) publishing keyed outbox messages into Kafka while the
// parent SIGKILLs them at random and terminates their database sessions
// (pg_terminate_backend), restarting each killed one. A plain
// read_committed consumer, with no inbox behind it, then reads the topic.
//
// With the TxSink it must count 0 duplicates, 0 lost, every key in order.
// With the kafka-go Sink it must lose nothing and keep the order of first
// deliveries; the duplicates the crashes cause are reported, not bounded.
func TestExactlyOnceKilledRelays(t *testing.T) {
	n := envInt(t, eosMessagesEnv, 5000)
	kills := envInt(t, eosKillsEnv, 10)
	for _, kind := range []string{"tx", "kafka-go"} {
		t.Run("sink="+kind, func(t *testing.T) {
			if spec, ok := relaytest.ChildArgs(t); ok {
				eosChild(t, spec)
				return
			}
			dups, skipped := eosRun(t, kind, n, kills)
			t.Logf("sink=%s: %d messages, %d SIGKILLs: %d duplicates seen by a read_committed consumer without inbox; %d rows deleted unpublished by the watermark",
				kind, n, kills, dups, skipped)
			if kind == "tx" && dups != 0 {
				t.Fatalf("the transactional sink delivered %d duplicates", dups)
			}
		})
	}
}

// eosRun runs the scenario for one sink kind and returns the duplicates
// and the rows the relays found committed by a watermark.
func eosRun(t *testing.T, kind string, n, kills int) (int, int) {
	const relays, keys = 3, 200
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	// Two destinations behind a Router: a key keeps to one of them, and
	// a batch reaches the sink in a call (a transaction) per destination.
	k := testenv.Kafka(t, 8, "orders", "payments")
	topics := []string{k.Topic("orders"), k.Topic("payments")}
	url := testenv.PostgresURL(t)
	pool, ob := newOutbox(t, ctx, url)
	spec := strings.Join([]string{kind, url, strings.Join(k.Brokers, ","), strings.Join(topics, ","),
		"idemq-watermarks-" + uuid.NewString()[:8], "eos-" + uuid.NewString()[:8] + "-"}, "|")

	logs := &watermarkLog{}
	children := make([]*relaytest.Child, relays)
	start := func(i int) { children[i] = relaytest.StartChild(t, spec, logs) }
	kill := func(i int) { children[i].Kill(t) }
	for i := range children {
		start(i)
	}
	defer func() {
		for i := range children {
			kill(i)
		}
	}()

	// The writer: n messages over keys keys, each payload "key/i" with i
	// counting up per key, in transactions of 100, paced so that the flow
	// lasts as long as the kills.
	const every = 600 * time.Millisecond // mean time between faults
	writerDone := make(chan error, 1)
	go func() {
		// The writer outruns the relays, so that most kills find them
		// busy publishing.
		pace := time.Duration(int64(kills) * int64(every) / int64(max(n/100, 1)) / 3)
		next := map[int]int{}
		for from := 0; from < n; from += 100 {
			msgs := make([]outbox.Message, min(100, n-from))
			for j := range msgs {
				key := rand.IntN(keys)
				msgs[j] = outbox.Message{Destination: topics[key%2], Key: fmt.Sprint("key-", key), Payload: fmt.Appendf(nil, "key-%d/%d", key, next[key])}
				next[key]++
			}
			if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return ob.EnqueueTx(ctx, tx, msgs...) }); err != nil {
				writerDone <- err
				return
			}
			_ = lifecycle.Sleep(ctx, pace)
		}
		writerDone <- nil
	}()

	for f := range kills + kills/3 {
		_ = lifecycle.Sleep(ctx, time.Duration(rand.Int64N(int64(2*every))))
		if f%4 == 3 {
			if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE datname = current_database() AND application_name = $1`, eosAppName); err != nil {
				t.Fatal(err)
			}
			continue
		}
		i := rand.IntN(relays)
		kill(i)
		start(i)
	}
	if err := <-writerDone; err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		s, err := ob.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if s.Dead > 0 {
			t.Fatalf("%d dead letters", s.Dead)
		}
		if s.Pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d messages still pending after 5 minutes", s.Pending)
		}
		_ = lifecycle.Sleep(ctx, 100*time.Millisecond)
	}
	for i := range children {
		kill(i)
	}

	records := readAllCommitted(t, ctx, k, topics)
	return checkExactlyOnce(t, records, n), logs.rows()
}

// watermarkLog collects the children's stderr: it sums the rows of their
// "deleted rows the sink had committed already" lines and passes other
// lines that say "error" or "panic" on.
type watermarkLog struct {
	mu      sync.Mutex
	partial []byte
	deleted int
}

func (l *watermarkLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, p...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			return len(p), nil
		}
		line := string(l.partial[:i])
		l.partial = l.partial[i+1:]
		switch {
		case strings.Contains(line, "committed already"):
			if _, after, ok := strings.Cut(line, " rows="); ok {
				v, _, _ := strings.Cut(after, " ")
				n, _ := strconv.Atoi(v)
				l.deleted += n
			}
		case strings.Contains(line, "level=ERROR"), strings.Contains(line, "panic"), strings.Contains(line, "eos child"):
			fmt.Fprintln(os.Stderr, line)
		}
	}
}

func (l *watermarkLog) rows() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deleted
}

// checkExactlyOnce checks that the records hold n distinct messages (by id
// header) and that each key's payloads first appear in order; it returns
// the duplicates.
func checkExactlyOnce(t *testing.T, records []*kgo.Record, n int) int {
	t.Helper()
	seen := map[string]bool{}
	next := map[string]int{} // key -> next sequence number expected
	dups := 0
	for _, r := range records {
		var id string
		for _, h := range r.Headers {
			if h.Key == franz.IDHeaderDefault {
				id = string(h.Value)
			}
		}
		if seen[id] {
			dups++
			continue
		}
		seen[id] = true
		key, num, _ := strings.Cut(string(r.Value), "/")
		i, _ := strconv.Atoi(num)
		if i != next[key] {
			t.Fatalf("key %s: message %d first appeared where %d was due", key, i, next[key])
		}
		next[key]++
	}
	if len(seen) != n {
		t.Fatalf("%d distinct messages of %d: %d lost", len(seen), n, n-len(seen))
	}
	return dups
}

// eosChild is a relay process of TestExactlyOnceKilledRelays: it runs
// until it is killed.
func eosChild(t *testing.T, spec string) {
	f := strings.Split(spec, "|")
	kind, url, brokers, topics, wmTopic, prefix := f[0], f[1], strings.Split(f[2], ","), strings.Split(f[3], ","), f[4], f[5]
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = eosAppName
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(pool, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var sink relay.Sink
	switch kind {
	case "tx":
		s, err := franz.NewTxSink(franz.TxConfig{Outbox: "idemq-eos", TransactionalIDPrefix: prefix, WatermarkTopic: wmTopic}, kgo.SeedBrokers(brokers...))
		if err != nil {
			t.Fatal(err)
		}
		sink = s
	case "kafka-go":
		s, err := idemqkafka.NewSink(idemqkafka.NewWriter(brokers...), idemqkafka.SinkConfig{})
		if err != nil {
			t.Fatal(err)
		}
		sink = s
	}
	router := relay.NewRouter()
	for _, topic := range topics {
		if err := router.Route(topic, sink); err != nil {
			t.Fatal(err)
		}
	}
	r, err := relay.New(pool, ob, router, relay.Config{
		BatchSize: 200, LeaseTTL: time.Second, PollInterval: 20 * time.Millisecond, PublishTimeout: 5 * time.Second,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	// A relay's Run returns on fatal errors only; keep running until the
	// parent kills us.
	for {
		if err := r.Run(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "eos child relay:", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
