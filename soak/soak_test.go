package soak

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
	idemqkafka "github.com/idemq/idemq/transports/kafka"
	idemqnats "github.com/idemq/idemq/transports/nats"
)

const (
	roleEnv     = "IDEMQ_SOAK_ROLE"     // relay, kafka or jetstream in a child process
	specEnv     = "IDEMQ_SOAK_SPEC"     // the child's spec, JSON
	messagesEnv = "IDEMQ_SOAK_MESSAGES" // messages per destination
	intervalEnv = "IDEMQ_SOAK_INTERVAL" // mean time between two faults
	keys        = 64                    // ordering keys
	partitions  = 4                     // of the Kafka topic
	relays      = 3                     // relay processes
	shortSoak   = 3000                  // messages per destination in a plain go test
)

// spec is what a child process needs to reach the servers.
type spec struct {
	DatabaseURL  string
	KafkaBrokers []string
	KafkaTopic   string
	KafkaGroup   string
	NATSURL      string
	Stream       string
	Subject      string
}

// TestMain runs a child's role when the soak re-executes this binary.
func TestMain(m *testing.M) {
	if role := os.Getenv(roleEnv); role != "" {
		// Killed connections and peers log errors that are the point here.
		slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
		var s spec
		err := json.Unmarshal([]byte(os.Getenv(specEnv)), &s)
		if err == nil {
			err = child(context.Background(), role, s)
		}
		fmt.Fprintf(os.Stderr, "soak %s: %v\n", role, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// childPool opens a pool named after role, so that the terminator picks
// the children's connections only.
func childPool(ctx context.Context, url, role string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "soak-" + role
	return pgxpool.NewWithConfig(ctx, cfg)
}

// sinks returns the Kafka and JetStream sinks of s, routed by destination.
func sinks(s spec) (*relay.Router, map[string]relay.Sink, error) {
	w := idemqkafka.NewWriter(s.KafkaBrokers...)
	ks, err := idemqkafka.NewSink(w, idemqkafka.SinkConfig{})
	if err != nil {
		return nil, nil, err
	}
	nc, err := nats.Connect(s.NATSURL, nats.MaxReconnects(-1))
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, nil, err
	}
	jss, err := idemqnats.NewJetStreamSink(js, idemqnats.SinkConfig{})
	if err != nil {
		return nil, nil, err
	}
	all := map[string]relay.Sink{s.KafkaTopic: ks, s.Subject: jss}
	router := relay.NewRouter()
	for dest, sink := range all {
		if err := router.Route(dest, sink); err != nil {
			return nil, nil, err
		}
	}
	return router, all, nil
}

// child runs one role until the process is killed.
func child(ctx context.Context, role string, s spec) error {
	pool, err := childPool(ctx, s.DatabaseURL, role)
	if err != nil {
		return err
	}
	var svc idemq.Service
	switch role {
	case "relay":
		ob, err := outbox.New(pool, outbox.Config{})
		if err != nil {
			return err
		}
		router, _, err := sinks(s)
		if err != nil {
			return err
		}
		svc, err = relay.New(pool, ob, router, relay.Config{BatchSize: 200, PollInterval: 100 * time.Millisecond,
			Retry: idemq.Retry{MaxAttempts: 1000, BaseDelay: 10 * time.Millisecond, MaxDelay: 500 * time.Millisecond}})
		if err != nil {
			return err
		}
	case "kafka", "jetstream":
		c, err := consumer.New(pool, role, func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
			key, seq, _ := strings.Cut(string(msg.Payload), ":")
			_, err := tx.Exec(ctx, `INSERT INTO effects (consumer, msg_id, key, seq) VALUES ($1, $2, $3, $4)`, role, msg.ID, key, seq)
			return err
		}, consumer.Config{Retry: idemq.Retry{MaxAttempts: 1000, BaseDelay: 10 * time.Millisecond, MaxDelay: 500 * time.Millisecond}})
		if err != nil {
			return err
		}
		if role == "kafka" {
			svc, err = idemqkafka.NewSubscriber(c, idemqkafka.SubscriberConfig{Brokers: s.KafkaBrokers, GroupID: s.KafkaGroup,
				Topics: []string{s.KafkaTopic}, Batch: true,
				// A killed member's partitions go to its successor within seconds.
				SessionTimeout: 6 * time.Second, HeartbeatInterval: time.Second, RebalanceTimeout: 6 * time.Second})
		} else {
			var nc *nats.Conn
			if nc, err = nats.Connect(s.NATSURL, nats.MaxReconnects(-1)); err != nil {
				return err
			}
			js, err := jetstream.New(nc)
			if err != nil {
				return err
			}
			cons, err := js.Consumer(ctx, s.Stream, "soak")
			if err != nil {
				return err
			}
			svc, err = idemqnats.NewJetStreamSubscriber(c, cons, js, idemqnats.JetStreamSubscriberConfig{Batch: true, FetchWait: 200 * time.Millisecond})
			if err != nil {
				return err
			}
		}
		if err != nil {
			return err
		}
	default:
		return fmt.Errorf("unknown role %q", role)
	}
	return svc.Run(ctx)
}

// proc is a supervised child process.
type proc struct {
	role string
	cmd  *exec.Cmd
}

func start(t *testing.T, role string, s spec) *proc {
	t.Helper()
	b, _ := json.Marshal(s)
	cmd := exec.Command(os.Args[0], "-test.run=^TestSoak$")
	cmd.Env = append(os.Environ(), roleEnv+"="+role, specEnv+"="+string(b))
	cmd.Stderr = os.Stderr
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", role, err)
	}
	return &proc{role: role, cmd: cmd}
}

func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
}

// messages is the soak's size: IDEMQ_SOAK_MESSAGES, or shortSoak.
func messages(t *testing.T) int {
	if v := os.Getenv(messagesEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("%s=%q: want a positive number", messagesEnv, v)
		}
		return n
	}
	return shortSoak
}

// interval is the mean time between two faults: IDEMQ_SOAK_INTERVAL, or
// 700ms. Every kill of the Kafka consumer costs a group rebalance of a
// session timeout (6s), so a long soak spaces its faults further apart.
func interval(t *testing.T) time.Duration {
	if v := os.Getenv(intervalEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("%s=%q: want a positive duration", intervalEnv, v)
		}
		return d
	}
	return 700 * time.Millisecond
}

func TestSoak(t *testing.T) {
	n := messages(t)
	mean := interval(t)
	ctx := context.Background()
	url := testenv.PostgresURL(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	k := testenv.Kafka(t, partitions, "soak")
	ns := testenv.NATS(t)
	s := spec{DatabaseURL: url, KafkaBrokers: k.Brokers, KafkaTopic: k.Topic("soak"),
		KafkaGroup: k.Group("soak"), NATSURL: ns.URL, Stream: ns.Name("SOAK"), Subject: ns.Name("soak")}
	nc := ns.ConnectTB(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ns.CreateStream(ctx, js, jetstream.StreamConfig{Name: s.Stream, Subjects: []string{s.Subject}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, s.Stream, jetstream.ConsumerConfig{Durable: "soak",
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(pool, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, role := range []string{"kafka", "jetstream"} {
		c, err := consumer.New(pool, role, func(context.Context, pgx.Tx, *consumer.Message) error { return nil }, consumer.Config{})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (seq_no bigserial PRIMARY KEY, consumer text NOT NULL, msg_id text NOT NULL, key text NOT NULL, seq int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	_, producerSinks, err := sinks(s)
	if err != nil {
		t.Fatal(err)
	}

	// The processes, and the chaos: SIGKILL a random one and restart it,
	// terminate a random connection of theirs.
	var mu sync.Mutex
	procs := []*proc{start(t, "kafka", s), start(t, "jetstream", s)}
	for range relays {
		procs = append(procs, start(t, "relay", s))
	}
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, p := range procs {
			p.kill()
		}
	}()
	var kills, terminations, republished int
	stop := make(chan struct{})
	chaosDone := make(chan struct{})
	go func() {
		defer close(chaosDone)
		for {
			select {
			case <-stop:
				return
			case <-time.After(mean/4 + rand.N(mean*3/2)):
			}
			if rand.IntN(2) == 0 {
				mu.Lock()
				i := kills % len(procs) // in turn: every role is killed early
				procs[i].kill()
				procs[i] = start(t, procs[i].role, s)
				kills++
				mu.Unlock()
				continue
			}
			var done int
			if err := pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM (SELECT pid FROM pg_stat_activity
				WHERE datname = current_database() AND application_name LIKE 'soak-%' ORDER BY random() LIMIT 1) p`).Scan(&done); err != nil {
				t.Errorf("terminate: %v", err)
				return
			}
			mu.Lock()
			terminations += done
			mu.Unlock()
		}
	}()

	// The producer: n messages per destination in transactions of 100,
	// each key's messages numbered in order; 2% are re-sent straight to the
	// broker once the relays have published them, as a producer that
	// retries. (A copy sent before the relays send the original would
	// overtake its key's earlier messages: that is a producer bug, not a
	// duplicate.)
	var again []relay.Message
	next := make([]int, keys)
	for batch := 0; batch < n; batch += 100 {
		var msgs []outbox.Message
		for i := batch; i < min(batch+100, n); i++ {
			key := i % keys
			seq := next[key]
			next[key]++
			for _, dest := range []string{s.KafkaTopic, s.Subject} {
				msgs = append(msgs, outbox.Message{ID: uuid.Must(uuid.NewV7()), Destination: dest,
					Key: fmt.Sprintf("k%d", key), Payload: fmt.Appendf(nil, "k%d:%d", key, seq)})
			}
		}
		if err := ob.Enqueue(ctx, msgs...); err != nil {
			t.Fatalf("enqueue: %v", err)
		}
		for _, m := range msgs {
			if rand.IntN(50) == 0 {
				again = append(again, relay.Message{Message: m})
			}
		}
	}
	deadline := time.Now().Add(time.Duration(n/50+120) * time.Second)
	for {
		stats, err := ob.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if stats.Pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the relays left %d messages in the outbox", stats.Pending)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, m := range again {
		if err := producerSinks[m.Destination].Publish(ctx, 0, []relay.Message{m}); err != nil {
			t.Fatalf("producer re-send: %v", err)
		}
	}
	republished = len(again)

	// Wait until both consumers applied every message.
	for {
		var kafka, js int
		if err := pool.QueryRow(ctx, `SELECT count(DISTINCT msg_id) FILTER (WHERE consumer = 'kafka'),
			count(DISTINCT msg_id) FILTER (WHERE consumer = 'jetstream') FROM effects`).Scan(&kafka, &js); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		faults := kills + terminations
		mu.Unlock()
		// A short soak may apply everything before the faults reached
		// every process; it goes on until they did.
		if kafka == n && js == n && faults >= 4*len(procs) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("applied %d on kafka and %d on jetstream of %d messages each", kafka, js, n)
		}
		time.Sleep(200 * time.Millisecond)
	}
	close(stop)
	<-chaosDone
	// Let the killed consumers' redeliveries come back before counting.
	time.Sleep(3 * time.Second)

	result := "OK"
	for _, role := range []string{"kafka", "jetstream"} {
		var rows, distinct int
		if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT msg_id) FROM effects WHERE consumer = $1`, role).Scan(&rows, &distinct); err != nil {
			t.Fatal(err)
		}
		if rows != n || distinct != n {
			result = "FAILED"
			t.Errorf("%s: %d effects, %d distinct messages, want %d of each", role, rows, distinct, n)
		}
	}
	// Kafka keeps each key's order through the relay, the partition and
	// the consumer's restarts from its committed offset.
	var disorders int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT seq, lag(seq) OVER (PARTITION BY key ORDER BY seq_no) AS prev
		FROM effects WHERE consumer = 'kafka') e WHERE prev IS NOT NULL AND seq <> prev + 1`).Scan(&disorders); err != nil {
		t.Fatal(err)
	}
	if disorders != 0 {
		result = "FAILED"
		t.Errorf("kafka: %d messages applied out of their key's order", disorders)
	}
	if err := checkStream(ctx, js, s.Stream, n); err != nil {
		result = "FAILED"
		t.Errorf("jetstream stream: %v", err)
	}
	copies, err := checkTopic(ctx, s.KafkaBrokers, s.KafkaTopic, partitions, n)
	if err != nil {
		result = "FAILED"
		t.Errorf("kafka topic: %v", err)
	}
	stats, err := ob.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if stats.Pending != 0 || stats.Dead != 0 {
		result = "FAILED"
		t.Errorf("outbox: %d pending, %d dead letters", stats.Pending, stats.Dead)
	}
	// Copies in the Kafka topic beyond the producer's re-sends are the
	// relays' re-publishes of batches whose delete a kill or a terminated
	// connection undid.
	kafkaResent := 0
	for _, m := range again {
		if m.Destination == s.KafkaTopic {
			kafkaResent++
		}
	}
	mu.Lock()
	t.Logf("soak: messages %d per destination (kafka, jetstream), producer duplicates %d, kills %d, terminations %d, relay re-publishes on kafka %d, result %s",
		n, republished, kills, terminations, copies-kafkaResent, result)
	mu.Unlock()
}

// arrivals checks a broker's log read from its start: it must hold each
// of the producer's messages (re-sent copies may come on top), and every
// key's messages must first appear in the order the producer numbered
// them.
type arrivals struct {
	copies int // messages seen again
	seen   map[string]bool
	last   map[string]int // per key, the number of its last first-seen message
}

func newArrivals() *arrivals {
	return &arrivals{seen: make(map[string]bool), last: make(map[string]int)}
}

func (a *arrivals) add(id string, payload []byte) error {
	if a.seen[id] {
		a.copies++
		return nil
	}
	a.seen[id] = true
	key, seqText, _ := strings.Cut(string(payload), ":")
	seq, _ := strconv.Atoi(seqText)
	if prev, ok := a.last[key]; ok && seq != prev+1 {
		return fmt.Errorf("key %s: message %d after %d", key, seq, prev)
	}
	a.last[key] = seq
	return nil
}

func (a *arrivals) complete(n int) error {
	if len(a.seen) != n {
		return fmt.Errorf("%d distinct messages, want %d", len(a.seen), n)
	}
	return nil
}

// checkStream reads the whole JetStream stream through arrivals.
func checkStream(ctx context.Context, js jetstream.JetStream, stream string, n int) error {
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return err
	}
	info, err := js.Stream(ctx, stream)
	if err != nil {
		return err
	}
	a := newArrivals()
	for read, total := uint64(0), info.CachedInfo().State.Msgs; read < total; {
		batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return err
		}
		for m := range batch.Messages() {
			read++
			if err := a.add(m.Headers().Get(jetstream.MsgIDHeader), m.Data()); err != nil {
				return err
			}
		}
		if err := batch.Error(); err != nil {
			return err
		}
	}
	return a.complete(n)
}

// checkTopic reads every partition of the Kafka topic through arrivals and
// returns how many copies it holds beyond the first of each message.
func checkTopic(ctx context.Context, brokers []string, topic string, partitions, n int) (copies int, err error) {
	a := newArrivals()
	for p := range partitions {
		conn, err := kafka.DialLeader(ctx, "tcp", brokers[0], topic, p)
		if err != nil {
			return 0, err
		}
		end, err := conn.ReadLastOffset()
		_ = conn.Close()
		if err != nil {
			return 0, err
		}
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: p, MaxBytes: 10 << 20})
		for offset := int64(0); offset < end; {
			m, err := r.ReadMessage(ctx)
			if err != nil {
				return 0, errors.Join(err, r.Close())
			}
			offset = m.Offset + 1
			var id string
			for _, h := range m.Headers {
				if h.Key == idemqkafka.IDHeaderDefault {
					id = string(h.Value)
				}
			}
			if err := a.add(id, m.Value); err != nil {
				return 0, errors.Join(err, r.Close())
			}
		}
		if err := r.Close(); err != nil {
			return 0, err
		}
	}
	return a.copies, a.complete(n)
}
