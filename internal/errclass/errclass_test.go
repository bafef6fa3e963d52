package errclass

import (
	"strings"
	"testing"
)

// TestOf: each error text's class, and texts that differ only in their
// variable parts share one.
func TestOf(t *testing.T) {
	for _, c := range []struct{ name, text, want string }{
		{"empty", "  ", "(no error text)"},
		{"plain", "sink closed", "sink closed"},
		{"uuid", "order 0192f3a4-5b6c-7d8e-9f01-23456789abcd not found", "order <uuid> not found"},
		{"numbers", "retry 3 of 10 after 250ms", "retry <n> of <n> after <n>"},
		{"hex", "trace 4bf92f3577b34da6a3ce929d0e0e4736 failed at 0xc000123", "trace <hex> failed at <hex>"},
		{"hex word stays", "feedback rejected", "feedback rejected"},
		{"quoted", `key "order-17" invalid: 'abc'`, "key <str> invalid: <str>"},
		{"timestamp", "deadline 2026-11-26T12:57:08.123Z passed", "deadline <time> passed"},
		{"pg timestamp", "at 2026-11-26 12:57:08+00 stop", "at <time> stop"},
		{"ipv4", "dial tcp 10.0.0.7:9092: connect: connection refused", "dial tcp <addr>: connect: connection refused"},
		{"ipv6", "dial tcp [::1]:5432: i/o timeout", "dial tcp <addr>: i/o timeout"},
		{"host port", "dial tcp kafka-0.kafka.svc:9092: no such host", "dial tcp <addr>: no such host"},
		{"localhost port", "dial tcp localhost:5432: refused", "dial tcp <addr>: refused"},
		{"word and number", "key jobs:7919 and jobs:1", "key jobs:<n> and jobs:<n>"},
		{"query", "GET https://a.example/hook?token=abc&n=3 failed", "GET https://a.example/hook?<query> failed"},
		{"http 5xx", "webhook: endpoint ep-1: HTTP 503: busy", "http 5xx: webhook: endpoint ep-<n>: HTTP <n>: busy"},
		{"http 4xx", "unexpected status code: 404", "http 4xx: unexpected status code: <n>"},
		{"sqlstate", `ERROR: duplicate key value violates unique constraint "orders_pkey" (SQLSTATE 23505)`,
			"sqlstate 23505: ERROR: duplicate key value violates unique constraint <str>"},
		{"kafka-go", "[6] Not Leader For Partition: the client attempted to send messages to a replica that is not the leader",
			"kafka 6: Not Leader For Partition: the client attempted to send messages to a replica that is not the leader"},
		{"franz-go", "NOT_LEADER_FOR_PARTITION: This server is not the leader for that topic-partition.",
			"kafka NOT_LEADER_FOR_PARTITION: This server is not the leader for that topic-partition."},
		{"nats", "nats: no responders available for request", "nats: no responders available for request"},
		{"whitespace", "a\n\tb   c", "a b c"},
		{"invalid utf8", "bad \xff byte", "bad byte"},
		{"nats wrapped", "nats: publish: nats: timeout", "nats: publish: timeout"},
		{"label twice", "webhook: webhook: endpoint not found: ep-1", "webhook: endpoint not found: ep-<n>"},
		{"franz-go wrapped", "produce: TOPIC_AUTHORIZATION_FAILED: Not authorized", "kafka TOPIC_AUTHORIZATION_FAILED: produce: Not authorized"},
		{"id after a prefix", "webhook-id msg_2f0c6d1e9a8b7c6d5e4f3a2b1c0d9e8f rejected", "webhook-id msg_<id> rejected"},
		{"request id", "request req_8c1e77 failed", "request req_<id> failed"},
		{"base62 id", "charge ch_3MqBnKxZy7Q2aB9 declined", "charge ch_<id> declined"},
		{"number after a prefix", "order_17 missing", "order_<id> missing"},
		{"code stays", "SASL_AUTHENTICATION_FAILED here", "SASL_AUTHENTICATION_FAILED here"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := Of(c.text); got != c.want {
				t.Errorf("Of(%q)\n got %q\nwant %q", c.text, got, c.want)
			}
		})
	}
}

// TestOfGroups: texts that differ only in ids, numbers, times and
// addresses fall in one class; texts of different causes do not.
func TestOfGroups(t *testing.T) {
	same := [][]string{
		{"webhook: endpoint e1: HTTP 500: oops 0192f3a4-5b6c-7d8e-9f01-23456789abcd", "webhook: endpoint e1: HTTP 502: oops 0192f3a4-5b6c-7d8e-9f01-000000000000"},
		{"dial tcp 10.0.0.1:9092: connection refused", "dial tcp 10.0.0.2:9093: connection refused"},
		{`payment "p-1" declined at 2026-01-01T00:00:00Z`, `payment "p-2" declined at 2026-02-03T04:05:06Z`},
	}
	for _, s := range same {
		if a, b := Of(s[0]), Of(s[1]); a != b {
			t.Errorf("%q and %q: classes %q and %q, want one", s[0], s[1], a, b)
		}
	}
	if a, b := Of("webhook: endpoint e: HTTP 500"), Of("webhook: endpoint e: HTTP 400"); a == b {
		t.Errorf("a 5xx and a 4xx share class %q", a)
	}
}

// TestOfBounded: a class never exceeds MaxLen bytes, and All classifies in
// order.
func TestOfBounded(t *testing.T) {
	if got := Of(strings.Repeat("é", 500)); len(got) > MaxLen {
		t.Errorf("class of %d bytes, want at most %d", len(got), MaxLen)
	}
	if got := All([]string{"a 1", "b 2"}); len(got) != 2 || got[0] != "a <n>" || got[1] != "b <n>" {
		t.Errorf("All: %q", got)
	}
}
