// Package errclass turns the text of an error into its class: the text
// with its variable parts (ids, numbers, addresses, times, quoted values)
// replaced by placeholders, prefixed with the error's type where the text
// names one (an HTTP status class, a SQLSTATE, a Kafka error code). Dead
// letters that failed for one cause share a class, so an operator sees
// three causes instead of a thousand messages.
//
// The class is computed from the stored text alone, never from the error
// value, so that the relay, the inbox and a backfill of rows written by an
// older version all compute the same class for the same text.
package errclass

import (
	"regexp"
	"strings"

	"github.com/idemq/idemq/internal/errtext"
)

// Unclassified is the class shown for a dead letter stored without one (a
// row written before the error_class column existed).
const Unclassified = "unclassified"

// MaxLen bounds a class, in bytes: long enough to tell causes apart, short
// enough for an index entry and a table cell.
const MaxLen = 200

// typed finds the error type a text names, in order; the first match wins.
var typed = []struct {
	re   *regexp.Regexp
	kind func(m []string) string
}{
	// pgconn: "ERROR: duplicate key value ... (SQLSTATE 23505)".
	{regexp.MustCompile(`\(SQLSTATE ([0-9A-Z]{5})\)`), func(m []string) string { return "sqlstate " + m[1] }},
	// HTTP: "HTTP 503", "HTTP/1.1 503", "status 503", "status code: 429".
	{regexp.MustCompile(`(?i)\b(?:HTTP(?:/[0-9.]+)?|status(?: code)?:?)\s*([1-5])[0-9]{2}\b`), func(m []string) string { return "http " + m[1] + "xx" }},
	// kafka-go: "[6] Not Leader For Partition: ...".
	{regexp.MustCompile(`\[(-?[0-9]{1,3})\] [A-Z][A-Za-z ]+:`), func(m []string) string { return "kafka " + m[1] }},
	// franz-go kerr: "NOT_LEADER_FOR_PARTITION: ...".
	{regexp.MustCompile(`\b([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+): `), func(m []string) string { return "kafka " + m[1] }},
	// nats.go: "nats: no responders available for request".
	{regexp.MustCompile(`\bnats: `), func([]string) string { return "nats" }},
}

// variable are the variable parts of a text and their placeholders, in the
// order they are replaced: a longer pattern before the shorter ones its
// matches contain (a timestamp holds numbers, a UUID hex).
var variable = []struct {
	re   *regexp.Regexp
	with string
}{
	// Quoted values: Go's %q, SQL's '...', backquotes.
	{regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`"), "<str>"},
	// Timestamps: RFC 3339 and Postgres' text form, with optional fraction
	// and zone.
	{regexp.MustCompile(`\b[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}:[0-9]{2}(?:[.,][0-9]+)?(?:Z|\s?[+-][0-9]{2}(?::?[0-9]{2})?)?`), "<time>"},
	// UUIDs.
	{regexp.MustCompile(`(?i)\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b`), "<uuid>"},
	// Network addresses: IPv6 in brackets and IPv4, with a port; a host
	// name with a port.
	{regexp.MustCompile(`\[[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*\](?::[0-9]+)?|\b[0-9]{1,3}(?:\.[0-9]{1,3}){3}(?::[0-9]+)?\b|\b[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*:[0-9]{2,5}\b`), "<addr>"},
	// Query strings of URLs.
	{regexp.MustCompile(`\?[^\s"']*`), "?<query>"},
	// Hex: 0x literals (runs of 8 or more hex digits are hex below).
	{regexp.MustCompile(`(?i)\b0x[0-9a-f]+\b`), "<hex>"},
	// Numbers, with a fraction and a unit suffix (durations, sizes).
	{regexp.MustCompile(`\b[0-9]+(?:\.[0-9]+)?(?:ns|µs|us|ms|s|m|h|[KMGT]i?B|B)?\b`), "<n>"},
}

// hexRun is a run of 8 or more hex digits (hashes, trace ids, pointers),
// replaced before numbers (step hexStep of variable) when it holds a digit,
// so that a word such as "feedback" stays.
var hexRun = regexp.MustCompile(`(?i)\b[0-9a-f]{8,}\b`)

// hexStep is the index in variable of the numbers.
const hexStep = 6

// hex is the placeholder of a hex run: <n> for decimal digits alone, <hex>
// when it holds a digit, the run itself otherwise.
func hex(s string) string {
	if strings.Trim(s, "0123456789") == "" {
		return "<n>"
	}
	if strings.ContainsAny(s, "0123456789") {
		return "<hex>"
	}
	return s
}

// whitespace collapses runs of blanks.
var whitespace = regexp.MustCompile(`\s+`)

// Of returns the class of an error text: "TYPE: normalized text" when the
// text names a type, the normalized text alone otherwise, at most MaxLen
// bytes. An empty text has the class "(no error text)".
func Of(text string) string {
	text = strings.TrimSpace(strings.ToValidUTF8(text, ""))
	if text == "" {
		return "(no error text)"
	}
	kind := ""
	for _, t := range typed {
		if m := t.re.FindStringSubmatch(text); m != nil {
			kind = t.kind(m)
			break
		}
	}
	norm := text
	for i, v := range variable {
		if i == hexStep {
			norm = hexRun.ReplaceAllStringFunc(norm, hex)
		}
		norm = v.re.ReplaceAllString(norm, v.with)
	}
	norm = whitespace.ReplaceAllString(norm, " ")
	if kind != "" {
		norm = kind + ": " + norm
	}
	return errtext.Truncate(norm, MaxLen)
}

// All returns the classes of texts, in order.
func All(texts []string) []string {
	out := make([]string, len(texts))
	for i, t := range texts {
		out[i] = Of(t)
	}
	return out
}
