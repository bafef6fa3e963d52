package main

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/testenv"
)

// The franz and kafka-tx routes: a relay publishes one topic through the
// franz-go Sink and another through the transactional TxSink (its
// watermark topic created on the way); every message arrives once with
// its id.
func TestRelayFranzAndKafkaTxRoutes(t *testing.T) {
	t.Parallel()
	url, _, ob := database(t)
	kc := testenv.Kafka(t, 3, "plain", "tx")
	plain, tx := kc.Topic("plain"), kc.Topic("tx")
	const n = 200
	plainIDs := enqueue(t, ob, plain, n, 7)
	txIDs := enqueue(t, ob, tx, n, 7)

	p := start(t, url, "relay", "--shutdown-grace", "5s", "--kafka-brokers", strings.Join(kc.Brokers, ","),
		"--route", plain+"=franz", "--route", tx+"=kafka-tx",
		"--kafka-tx-id-prefix", kc.Group("tx-")+"-", "--kafka-watermark-topic", kc.Group("watermarks"))
	idemqtest.WaitForNoError(t, "outbox drained", func() error {
		if n := pending(t, ob); n > 0 {
			return fmt.Errorf("%d pending", n)
		}
		return nil
	})
	if code := p.signal(t, syscall.SIGTERM, 35*time.Second); code != 0 {
		t.Fatalf("relay exit %d after SIGTERM\n%s", code, p.stderr.String())
	}
	for _, c := range []struct {
		topic string
		want  []string
	}{{plain, plainIDs}, {tx, txIDs}} {
		msgs, err := kc.ReadAll(context.Background(), c.topic)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, m := range msgs {
			for _, h := range m.Headers {
				if h.Key == "Idempotency-Key" {
					got = append(got, string(h.Value))
				}
			}
		}
		if len(got) != n {
			t.Errorf("%s holds %d messages, want %d", c.topic, len(got), n)
		}
		sameSet(t, c.topic, got, c.want)
	}
}

// The kafka-tx routes share one TxSink, whose topic is the target of the
// route the Router picked: an exact route over any prefix, the longest
// prefix otherwise.
func TestKafkaTxTopicOfRoutes(t *testing.T) {
	var routes []route
	for _, spec := range []string{"orders.*=kafka-tx:ORDERS", "orders.eu.*=kafka-tx:ORDERS_EU", "orders.special=kafka-tx", "pay.*=kafka-tx"} {
		r, err := parseRoute(spec)
		if err != nil {
			t.Fatal(err)
		}
		routes = append(routes, r)
	}
	topic := topicOf(routes)
	for dest, want := range map[string]string{
		"orders.created": "ORDERS", "orders.eu.created": "ORDERS_EU", "orders.special": "orders.special", "pay.1": "pay.1",
	} {
		if got := topic(dest); got != want {
			t.Errorf("topic(%q) = %q, want %q", dest, got, want)
		}
	}
}
