package errclass_test

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemq/idemq/internal/errclass"
	"github.com/idemq/idemq/testenv"
	"github.com/idemq/idemq/transports/webhook"
	"github.com/idemq/idemq/transports/webhook/endpoints"
)

// update rewrites testdata/corpus.jsonl from the errors the clients
// return now: go test ./internal/errclass -run TestRealClientErrors -update.
var update = flag.Bool("update", false, "rewrite testdata/corpus.jsonl from the clients' real errors")

const corpusFile = "testdata/corpus.jsonl"

// sample is one real error text of the corpus and its class.
type sample struct {
	Client string `json:"client"`
	Case   string `json:"case"`
	Text   string `json:"text"`
	Class  string `json:"class"`
}

func readCorpus(t *testing.T) []sample {
	t.Helper()
	f, err := os.Open(corpusFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []sample
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var s sample
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			t.Fatalf("%s: %v", corpusFile, err)
		}
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// doubled reports a label said twice in class: twice in a row
// ("webhook: webhook: "), or the type's token after its label ("nats: …
// nats: ", "kafka CODE: … CODE: ", "sqlstate X: … (SQLSTATE X)").
func doubled(class string) bool {
	parts := strings.Split(class, ": ")
	for i := 1; i < len(parts); i++ {
		if parts[i] == parts[i-1] {
			return true
		}
	}
	label, rest, _ := strings.Cut(class, ": ")
	token := label[strings.LastIndex(label, " ")+1:]
	switch {
	case label == "nats":
		return strings.Contains(rest, "nats: ")
	case strings.HasPrefix(label, "kafka "):
		return strings.Contains(rest, token+": ") || strings.Contains(rest, "["+token+"]")
	case strings.HasPrefix(label, "sqlstate "):
		return strings.Contains(rest, "SQLSTATE")
	}
	return false
}

// TestCorpus classifies the corpus of real error texts that the clients
// idemq uses returned (pgx, kafka-go, franz-go, nats.go, net/http, the AWS
// SDK, go-redis, idemq's webhook Sink; recorded by TestRealClientErrors):
// each text keeps its recorded class, and no class says a label twice.
func TestCorpus(t *testing.T) {
	corpus := readCorpus(t)
	clients := map[string]bool{}
	for _, s := range corpus {
		clients[s.Client] = true
		got := errclass.Of(s.Text)
		if got != s.Class {
			t.Errorf("%s %s: %q\n got class %q\nwant %q", s.Client, s.Case, s.Text, got, s.Class)
		}
		if doubled(got) {
			t.Errorf("%s %s: class %q says a label twice", s.Client, s.Case, got)
		}
	}
	for _, c := range []string{"pgx", "kafka-go", "franz-go", "nats.go", "net/http", "aws-sdk", "go-redis", "webhook"} {
		if !clients[c] {
			t.Errorf("the corpus has no error of %s", c)
		}
	}
}

// TestIDsAfterAPrefixMakeOneGroup: 5,000 errors that differ only by an id
// after a prefix (msg_<32 hex>, req_<hex>, a base62 id, an AWS request id)
// make one class per kind, whatever client text they sit in.
func TestIDsAfterAPrefixMakeOneGroup(t *testing.T) {
	forms := []func(i int) string{
		func(i int) string {
			return fmt.Sprintf("webhook: endpoint ep-1: HTTP 500: webhook-id msg_%032x rejected", uint64(i)*0x9e3779b97f4a7c15)
		},
		func(i int) string { return fmt.Sprintf("request req_%x failed: upstream timeout", i*7919+0x10000) },
		func(i int) string { return fmt.Sprintf("charge ch_3Mq%dBnKxZy7Q2 declined", i) },
		func(i int) string { return fmt.Sprintf("order_%d: not found", i) },
		func(i int) string {
			return fmt.Sprintf("operation error DynamoDB: PutItem, https response error StatusCode: 400, RequestID: %052X, ResourceNotFoundException: Cannot do operations on a non-existent table", i)
		},
	}
	for _, form := range forms {
		classes := map[string]bool{}
		for i := range 5000 {
			classes[errclass.Of(form(i))] = true
		}
		if len(classes) != 1 {
			some := slices.Collect(func(yield func(string) bool) {
				for c := range classes {
					if !yield(c) {
						return
					}
				}
			})
			t.Errorf("%q and the like: %d classes, want 1; some: %q", form(0), len(classes), some[:min(3, len(some))])
		}
	}
}

// closedAddr returns an address of 127.0.0.1 nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// TestRealClientErrors makes each client idemq uses fail for real, twice
// with other ids, ports or names each time (a closed port; a server that
// refuses: Postgres, kfake, nats-server, Redis, dynalite, an HTTP
// endpoint), and checks that both texts share one class and that the
// corpus holds it: a client upgrade that changes its texts fails here
// until -update records them.
func TestRealClientErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	type produce struct {
		client, name string
		fail         func(i int) error
	}
	pool := testenv.Postgres(t)
	k := testenv.Kafka(t, 1)
	ns := testenv.NATS(t)
	rdb, prefix := testenv.Redis(t)
	ddb, tablePrefix := testenv.DynamoDB(t)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "webhook-id %s rejected: queue full", r.Header.Get("webhook-id"))
	}))
	defer hook.Close()
	produces := []produce{
		{"pgx", "connection refused", func(int) error {
			c, err := pgx.Connect(ctx, "postgres://postgres@"+closedAddr(t)+"/idemq?connect_timeout=5")
			if err == nil {
				c.Close(ctx)
			}
			return err
		}},
		{"pgx", "undefined table", func(i int) error {
			_, err := pool.Exec(ctx, fmt.Sprintf("SELECT 1 FROM idemq_missing_%d", i))
			return err
		}},
		{"pgx", "unique violation", func(i int) error {
			_, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TEMP TABLE IF NOT EXISTS t%d (id int PRIMARY KEY); INSERT INTO t%[1]d VALUES (%[1]d), (%[1]d)`, i))
			return err
		}},
		{"kafka-go", "connection refused", func(int) error {
			w := &kafka.Writer{Addr: kafka.TCP(closedAddr(t)), Topic: "orders", MaxAttempts: 1}
			defer w.Close()
			return w.WriteMessages(ctx, kafka.Message{Value: []byte("x")})
		}},
		{"kafka-go", "unknown topic", func(i int) error {
			c := &kafka.Client{Addr: kafka.TCP(k.Brokers...), Timeout: 10 * time.Second}
			resp, err := c.Produce(ctx, &kafka.ProduceRequest{Topic: fmt.Sprintf("missing-%d", i), RequiredAcks: kafka.RequireAll,
				Records: kafka.NewRecordReader(kafka.Record{Value: kafka.NewBytes([]byte("x"))})})
			if err != nil {
				return err
			}
			return resp.Error
		}},
		{"franz-go", "connection refused", func(int) error {
			c, err := kgo.NewClient(kgo.SeedBrokers(closedAddr(t)), kgo.RecordRetries(1), kgo.RecordDeliveryTimeout(time.Second))
			if err != nil {
				return err
			}
			defer c.Close()
			return c.ProduceSync(ctx, &kgo.Record{Topic: "orders", Value: []byte("x")}).FirstErr()
		}},
		{"franz-go", "unknown topic", func(i int) error {
			c, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...), kgo.UnknownTopicRetries(0))
			if err != nil {
				return err
			}
			defer c.Close()
			return c.ProduceSync(ctx, &kgo.Record{Topic: fmt.Sprintf("missing-%d", i), Value: []byte("x")}).FirstErr()
		}},
		{"franz-go", "authorization failed", func(i int) error {
			// kfake runs without ACLs: the broker's error code, as kerr
			// renders it for a produce to topic i.
			return fmt.Errorf("produce to topic orders-%d: %w", i, kerr.TopicAuthorizationFailed)
		}},
		{"nats.go", "connection refused", func(int) error {
			nc, err := nats.Connect("nats://"+closedAddr(t), nats.Timeout(2*time.Second))
			if err == nil {
				nc.Close()
			}
			return err
		}},
		{"nats.go", "no responders", func(i int) error {
			nc, err := nats.Connect(ns.URL)
			if err != nil {
				return err
			}
			defer nc.Close()
			_, err = nc.Request(fmt.Sprintf("orders.%d", i), []byte("x"), 2*time.Second)
			return err
		}},
		{"nats.go", "stream not found", func(i int) error {
			nc, err := nats.Connect(ns.URL)
			if err != nil {
				return err
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				return err
			}
			_, err = js.Stream(ctx, fmt.Sprintf("MISSING_%d", i))
			return err
		}},
		{"net/http", "connection refused", func(i int) error {
			resp, err := http.Get(fmt.Sprintf("http://%s/hooks?event=evt_%032x", closedAddr(t), i*7919))
			if err == nil {
				resp.Body.Close()
			}
			return err
		}},
		{"net/http", "client timeout", func(i int) error {
			slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }))
			defer slow.Close()
			resp, err := (&http.Client{Timeout: 50 * time.Millisecond}).Get(fmt.Sprintf("%s/hooks/%d", slow.URL, i))
			if err == nil {
				resp.Body.Close()
			}
			return err
		}},
		{"webhook", "503 with a webhook-id", func(i int) error {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, hook.URL, nil)
			req.Header.Set("webhook-id", fmt.Sprintf("msg_%032x", uint64(i+1)*0x9e3779b97f4a7c15))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			body := make([]byte, 512)
			n, _ := resp.Body.Read(body)
			return &webhook.DeliveryError{Endpoint: fmt.Sprintf("ep-%d", i), Status: resp.StatusCode, Body: body[:n]}
		}},
		{"webhook", "endpoint not found", func(i int) error {
			return fmt.Errorf("webhook: %w: %s", endpoints.ErrEndpointNotFound, fmt.Sprintf("ep_%x", 0x5f3759df+i))
		}},
		{"aws-sdk", "connection refused", func(int) error {
			_, err := testenv.DynamoDBClient("http://"+closedAddr(t)).GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String("requests"),
				Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "k"}}})
			return err
		}},
		{"aws-sdk", "table not found", func(i int) error {
			_, err := ddb.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(fmt.Sprintf("%s_missing_%d", tablePrefix, i)),
				Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "k"}}})
			return err
		}},
		{"go-redis", "connection refused", func(int) error {
			c := redis.NewClient(&redis.Options{Addr: closedAddr(t), MaxRetries: -1, DialTimeout: 2 * time.Second})
			defer c.Close()
			return c.Ping(ctx).Err()
		}},
		{"go-redis", "wrong type", func(i int) error {
			key := fmt.Sprintf("%s:list:%d", prefix, i)
			if err := rdb.RPush(ctx, key, "x").Err(); err != nil {
				return err
			}
			return rdb.Get(ctx, key).Err()
		}},
	}
	var recorded []sample
	known := map[string]bool{}
	if !*update {
		for _, s := range readCorpus(t) {
			known[s.Client+"\x00"+s.Case+"\x00"+s.Class] = true
		}
	}
	for _, p := range produces {
		var texts []string
		for i := range 2 {
			err := p.fail(i + 1)
			if err == nil {
				t.Fatalf("%s %s: no error", p.client, p.name)
			}
			texts = append(texts, err.Error())
		}
		a, b := errclass.Of(texts[0]), errclass.Of(texts[1])
		if a != b {
			t.Errorf("%s %s: one cause, two classes:\n%q -> %q\n%q -> %q", p.client, p.name, texts[0], a, texts[1], b)
		}
		if doubled(a) {
			t.Errorf("%s %s: class %q says a label twice", p.client, p.name, a)
		}
		if !*update && !known[p.client+"\x00"+p.name+"\x00"+a] {
			t.Errorf("%s %s: class %q of %q is not in %s: run this test with -update", p.client, p.name, a, texts[0], corpusFile)
		}
		recorded = append(recorded, sample{Client: p.client, Case: p.name, Text: texts[0], Class: a})
	}
	if *update && !t.Failed() {
		var out strings.Builder
		enc := json.NewEncoder(&out)
		enc.SetEscapeHTML(false)
		for _, s := range recorded {
			if err := enc.Encode(s); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(corpusFile, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
