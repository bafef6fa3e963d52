package outboxsql

import (
	"maps"
	"strings"
	"testing"
)

func TestDecodeHeaders(t *testing.T) {
	for raw, want := range map[string]map[string]string{
		`{"a":"b","c":""}`:       {"a": "b", "c": ""},
		`{"n":1,"o":{"x":true}}`: {"n": "1", "o": `{"x":true}`},
		`null`:                   nil,
	} {
		got, err := DecodeHeaders([]byte(raw))
		if err != nil || !maps.Equal(got, want) {
			t.Errorf("DecodeHeaders(%s) = %v, %v; want %v", raw, got, err, want)
		}
	}
	if got, err := DecodeHeaders(nil); got != nil || err != nil {
		t.Errorf("DecodeHeaders(nil) = %v, %v", got, err)
	}
	for _, raw := range []string{`[1]`, `"s"`, `{`} {
		if _, err := DecodeHeaders([]byte(raw)); err == nil {
			t.Errorf("DecodeHeaders(%s) accepted a column that is not an object", raw)
		}
	}
}

// TestStatementsNameTheirTables: every statement names its own tables, so
// two outboxes never share rows, leases or relays.
func TestStatementsNameTheirTables(t *testing.T) {
	a, err := For("public", "idemq_outbox")
	if err != nil {
		t.Fatal(err)
	}
	b, err := For("app", "idemq_outbox")
	if err != nil {
		t.Fatal(err)
	}
	if a.Hold == b.Hold || a.Take == b.Take {
		t.Fatal("two tables share a lease table")
	}
	if !strings.Contains(b.Claim, `"app"."idemq_outbox"`) || !strings.Contains(b.Bury, `"app"."idemq_outbox_dead"`) ||
		!strings.Contains(b.Hold, `"app"."idemq_outbox_lease"`) || !strings.Contains(b.Take, `"app"."idemq_outbox_relays"`) {
		t.Fatal("statements do not name the table")
	}
	if _, err := For("public", "Bad"); err == nil {
		t.Fatal("For accepted an invalid table name")
	}
}
