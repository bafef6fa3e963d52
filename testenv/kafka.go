package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
)

// KafkaBrokersEnv names the environment variable that points the Kafka
// helpers at real brokers (a comma-separated list of host:port) instead of
// the in-process kfake cluster.
const KafkaBrokersEnv = "IDEMQ_TEST_KAFKA_BROKERS"

const kafkaHelp = `unset ` + KafkaBrokersEnv + ` to use the in-process broker, or point it at
reachable brokers where the client may create and delete topics`

// KafkaCluster is a Kafka cluster for one test (or one demo run): either an
// in-process [kfake] broker speaking the real wire protocol, or the brokers
// named by IDEMQ_TEST_KAFKA_BROKERS.
//
// Topic names are isolated per cluster value: ask for the logical name a
// test uses ("orders") with [KafkaCluster.Topic] and get the real one
// ("orders.3f2a…"), so parallel tests sharing real brokers never see each
// other's messages. [KafkaCluster.Group] does the same for consumer groups.
type KafkaCluster struct {
	// Brokers are the bootstrap addresses (host:port).
	Brokers []string
	// Partitions is the partition count of every topic created.
	Partitions int

	suffix string
	topics map[string]string // logical -> real

	mu       sync.Mutex
	fake     *kfake.Cluster // nil on real brokers
	dataDir  string         // kfake persistence, for Restart
	ownsDir  bool
	port     int
	external bool
}

// Kafka returns a Kafka cluster with the given topics, each with partitions
// partitions, for tb. Without IDEMQ_TEST_KAFKA_BROKERS it starts an
// in-process kfake broker, closed at cleanup; with it, it creates the topics
// on those brokers and deletes them at cleanup. An unreachable broker fails
// the test with a message saying what to do.
func Kafka(tb testing.TB, partitions int, topics ...string) *KafkaCluster {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	k, err := startKafka(ctx, partitions, tb.TempDir(), topics...)
	if err != nil {
		tb.Fatalf("testenv: %v\n%s", err, kafkaHelp)
	}
	tb.Cleanup(func() {
		if err := k.Close(); err != nil {
			tb.Errorf("testenv: close Kafka: %v", err)
		}
	})
	return k
}

// StartKafka is [Kafka] for programs (examples, benchmarks driven by hand):
// the caller must call [KafkaCluster.Close], which stops the in-process
// broker or deletes the topics created on real brokers.
func StartKafka(ctx context.Context, partitions int, topics ...string) (*KafkaCluster, error) {
	dir, err := os.MkdirTemp("", "idemq-kfake-")
	if err != nil {
		return nil, fmt.Errorf("testenv: kafka data dir: %w", err)
	}
	k, err := startKafka(ctx, partitions, dir, topics...)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	k.ownsDir = true
	return k, nil
}

func startKafka(ctx context.Context, partitions int, dataDir string, topics ...string) (*KafkaCluster, error) {
	if partitions <= 0 {
		return nil, fmt.Errorf("kafka: partitions must be positive, got %d", partitions)
	}
	k := &KafkaCluster{
		Partitions: partitions,
		suffix:     randomSuffix(),
		topics:     make(map[string]string, len(topics)),
		dataDir:    dataDir,
	}
	real := make([]string, 0, len(topics))
	for _, t := range topics {
		r := t + "." + k.suffix
		k.topics[t] = r
		real = append(real, r)
	}

	if env := os.Getenv(KafkaBrokersEnv); env != "" {
		k.external = true
		for _, b := range strings.Split(env, ",") {
			if b = strings.TrimSpace(b); b != "" {
				k.Brokers = append(k.Brokers, b)
			}
		}
		if err := k.createTopics(ctx, real); err != nil {
			return nil, fmt.Errorf("kafka at %s: %w", env, err)
		}
		return k, nil
	}

	fake, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.SeedTopics(int32(partitions), real...),
		kfake.DefaultNumPartitions(partitions),
		kfake.DataDir(dataDir),
	)
	if err != nil {
		return nil, fmt.Errorf("start in-process kafka (kfake): %w", err)
	}
	k.fake = fake
	k.Brokers = fake.ListenAddrs()
	_, portStr, _ := net.SplitHostPort(k.Brokers[0])
	k.port, _ = strconv.Atoi(portStr)
	return k, nil
}

// Topic returns the real name of the topic a test asked for by its logical
// name. It panics on a name that was not requested, a bug in the test.
func (k *KafkaCluster) Topic(name string) string {
	r, ok := k.topics[name]
	if !ok {
		panic(fmt.Sprintf("testenv: topic %q was not requested from Kafka()", name))
	}
	return r
}

// Group returns a consumer-group id unique to this cluster value for the
// logical name, so reruns against real brokers start from scratch.
func (k *KafkaCluster) Group(name string) string { return name + "." + k.suffix }

// External reports whether the cluster is made of real brokers named by
// IDEMQ_TEST_KAFKA_BROKERS (and so cannot be restarted by [KafkaCluster.Restart]).
func (k *KafkaCluster) External() bool { return k.external }

// Addr returns the bootstrap addresses as a kafka-go net.Addr.
func (k *KafkaCluster) Addr() net.Addr { return kafka.TCP(k.Brokers...) }

// Writer returns a synchronous kafka-go Writer on the cluster that hashes
// keys to partitions, waits for all in-sync replicas and flushes partial
// batches after a millisecond. The caller closes it.
func (k *KafkaCluster) Writer() *kafka.Writer {
	return &kafka.Writer{
		Addr:         k.Addr(),
		Balancer:     &kafka.Hash{},
		RequiredAcks: kafka.RequireAll,
		BatchSize:    10_000,
		BatchBytes:   16 << 20,
		BatchTimeout: time.Millisecond,
	}
}

// Produce writes msgs (each with its real Topic set) in one batch and waits
// for the acknowledgements.
func (k *KafkaCluster) Produce(ctx context.Context, msgs ...kafka.Message) error {
	w := k.Writer()
	t := &kafka.Transport{}
	w.Transport = t
	defer t.CloseIdleConnections()
	defer w.Close()
	return w.WriteMessages(ctx, msgs...)
}

// Stop takes the in-process broker away (connections refused) until
// [KafkaCluster.Restart]; its data and committed offsets survive on disk.
// It fails on real brokers.
func (k *KafkaCluster) Stop() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.external {
		return errors.New("testenv: cannot stop real Kafka brokers")
	}
	if k.fake != nil {
		k.fake.Close()
		k.fake = nil
	}
	return nil
}

// Restart brings a stopped in-process broker back on the same address with
// its topics, messages and committed offsets. It fails on real brokers.
func (k *KafkaCluster) Restart() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.external {
		return errors.New("testenv: cannot restart real Kafka brokers")
	}
	if k.fake != nil {
		return nil
	}
	var err error
	for range 50 { // the port may linger for a moment after Close
		var fake *kfake.Cluster
		fake, err = kfake.NewCluster(
			kfake.NumBrokers(1),
			kfake.Ports(k.port),
			kfake.DefaultNumPartitions(k.Partitions),
			kfake.DataDir(k.dataDir),
		)
		if err == nil {
			k.fake = fake
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("testenv: restart kafka on port %d: %w", k.port, err)
}

// Close stops the in-process broker, or deletes the topics created on real
// brokers.
func (k *KafkaCluster) Close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	var err error
	if k.external {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		names := make([]string, 0, len(k.topics))
		for _, r := range k.topics {
			names = append(names, r)
		}
		err = k.deleteTopics(ctx, names)
	} else if k.fake != nil {
		k.fake.Close()
		k.fake = nil
	}
	if k.ownsDir {
		err = errors.Join(err, os.RemoveAll(k.dataDir))
	}
	return err
}

func (k *KafkaCluster) client() *kafka.Client {
	return &kafka.Client{Addr: k.Addr(), Timeout: 20 * time.Second}
}

func (k *KafkaCluster) createTopics(ctx context.Context, names []string) error {
	if len(names) == 0 {
		// Still prove the brokers are reachable.
		_, err := k.client().Metadata(ctx, &kafka.MetadataRequest{})
		return err
	}
	req := &kafka.CreateTopicsRequest{}
	for _, n := range names {
		req.Topics = append(req.Topics, kafka.TopicConfig{Topic: n, NumPartitions: k.Partitions, ReplicationFactor: -1})
	}
	resp, err := k.client().CreateTopics(ctx, req)
	if err != nil {
		return fmt.Errorf("create topics: %w", err)
	}
	for n, e := range resp.Errors {
		if e != nil && !errors.Is(e, kafka.TopicAlreadyExists) {
			return fmt.Errorf("create topic %s: %w", n, e)
		}
	}
	// Wait until every topic has a leader for every partition.
	for {
		md, err := k.client().Metadata(ctx, &kafka.MetadataRequest{Topics: names})
		if err == nil && topicsReady(md, names, k.Partitions) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("topics %v not ready: %w", names, errors.Join(ctx.Err(), err))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func topicsReady(md *kafka.MetadataResponse, names []string, partitions int) bool {
	ready := 0
	for _, t := range md.Topics {
		if t.Error == nil && len(t.Partitions) == partitions {
			ready++
		}
	}
	return ready == len(names)
}

func (k *KafkaCluster) deleteTopics(ctx context.Context, names []string) error {
	if len(names) == 0 {
		return nil
	}
	resp, err := k.client().DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: names})
	if err != nil {
		return fmt.Errorf("delete topics: %w", err)
	}
	for n, e := range resp.Errors {
		if e != nil && !errors.Is(e, kafka.UnknownTopicOrPartition) {
			return fmt.Errorf("delete topic %s: %w", n, e)
		}
	}
	return nil
}

// ReadAll returns every message currently in topic (a real name), partition
// by partition in offset order, without joining a group.
func (k *KafkaCluster) ReadAll(ctx context.Context, topic string) ([]kafka.Message, error) {
	var out []kafka.Message
	for p := range k.Partitions {
		conn, err := kafka.DialLeader(ctx, "tcp", k.Brokers[0], topic, p)
		if err != nil {
			return nil, fmt.Errorf("testenv: dial %s/%d: %w", topic, p, err)
		}
		first, last, err := conn.ReadOffsets()
		conn.Close()
		if err != nil {
			return nil, fmt.Errorf("testenv: offsets of %s/%d: %w", topic, p, err)
		}
		if last <= first {
			continue
		}
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: k.Brokers, Topic: topic, Partition: p, MaxWait: 50 * time.Millisecond})
		if err := r.SetOffset(first); err != nil {
			r.Close()
			return nil, err
		}
		for {
			m, err := r.ReadMessage(ctx)
			if err != nil {
				r.Close()
				return nil, fmt.Errorf("testenv: read %s/%d: %w", topic, p, err)
			}
			out = append(out, m)
			if m.Offset >= last-1 {
				break
			}
		}
		r.Close()
	}
	return out, nil
}
