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
// drop removes from the normalized text the token the type was read from
// ("nats: ", "NOT_LEADER_FOR_PARTITION: ", "[<n>] ", "(SQLSTATE …)"): the
// label carries it, so the class does not say it twice.
var typed = []struct {
	re   *regexp.Regexp
	kind func(m []string) string
	drop func(norm string, m []string) string
}{
	// pgconn: "ERROR: duplicate key value ... (SQLSTATE 23505)".
	{regexp.MustCompile(`\(SQLSTATE ([0-9A-Z]{5})\)`), func(m []string) string { return "sqlstate " + m[1] },
		func(norm string, _ []string) string { return sqlstate.ReplaceAllString(norm, "") }},
	// HTTP: "HTTP 503", "HTTP/1.1 503", "status 503", "status code: 429",
	// the AWS SDK's "StatusCode: 400".
	{regexp.MustCompile(`(?i)\b(?:HTTP(?:/[0-9.]+)?|status(?: ?code)?:?)\s*([1-5])[0-9]{2}\b`), func(m []string) string { return "http " + m[1] + "xx" },
		func(norm string, _ []string) string { return norm }},
	// kafka-go: "[6] Not Leader For Partition: ...".
	{regexp.MustCompile(`\[(-?[0-9]{1,3})\] [A-Z][A-Za-z ]+:`), func(m []string) string { return "kafka " + m[1] },
		func(norm string, _ []string) string { return strings.Replace(norm, "[<n>] ", "", 1) }},
	// franz-go kerr: "NOT_LEADER_FOR_PARTITION: ...".
	{regexp.MustCompile(`\b([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+): `), func(m []string) string { return "kafka " + m[1] },
		func(norm string, m []string) string { return strings.ReplaceAll(norm, m[1]+": ", "") }},
	// nats.go: "nats: no responders available for request".
	{regexp.MustCompile(`\bnats: `), func([]string) string { return "nats" },
		func(norm string, _ []string) string { return strings.ReplaceAll(norm, "nats: ", "") }},
}

// sqlstate is pgconn's "(SQLSTATE 23505)" after normalization.
var sqlstate = regexp.MustCompile(` ?\(SQLSTATE [^)]*\)`)

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
	// name (with a dot, or localhost) with a port. A word and a number
	// ("jobs:7919") are not an address: the number is a number.
	{regexp.MustCompile(`\[[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*\](?::[0-9]+)?|\b[0-9]{1,3}(?:\.[0-9]{1,3}){3}(?::[0-9]+)?\b|\b(?:[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+|localhost):[0-9]{2,5}\b`), "<addr>"},
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

// prefixed is a word whose parts are joined by underscores ("msg_2f0c…",
// "req_8c1e77", "order_17"), or a run of 16 or more letters and digits (a
// base62 or base32 id: an AWS request id): \b does not separate the parts
// of the first, and neither hexRun nor numbers catch the second.
var prefixed = regexp.MustCompile(`\b[A-Za-z0-9]+(?:_[A-Za-z0-9]+)+\b|\b[A-Za-z0-9]{16,}\b`)

// hexStep is the index in variable of the numbers.
const hexStep = 6

// ids replaces the variable parts of a prefixed word. Joined by
// underscores, every part that holds a digit is an id whatever its length
// (the prefix "msg", "req" or a code such as TOPIC_AUTHORIZATION_FAILED
// stays), so that ids of one kind share a class. A long run is <hex> when
// it is all hex digits, <id> when it holds a digit, itself otherwise.
func ids(word string) string {
	if !strings.Contains(word, "_") {
		switch {
		case !strings.ContainsAny(word, "0123456789"):
			return word
		case strings.Trim(strings.ToLower(word), "0123456789abcdef") == "":
			return "<hex>"
		}
		return "<id>"
	}
	parts := strings.Split(word, "_")
	for i, p := range parts {
		if strings.ContainsAny(p, "0123456789") {
			parts[i] = "<id>"
		}
	}
	return strings.Join(parts, "_")
}

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
// bytes. A label said twice in a row ("webhook: webhook: ") is said once,
// and the type's own token is said by the label alone ("nats: timeout",
// not "nats: nats: timeout"). An empty
// text has the class "(no error text)".
func Of(text string) string {
	text = strings.TrimSpace(strings.ToValidUTF8(text, ""))
	if text == "" {
		return "(no error text)"
	}
	kind, match := -1, []string(nil)
	for i, t := range typed {
		if match = t.re.FindStringSubmatch(text); match != nil {
			kind = i
			break
		}
	}
	norm := text
	for i, v := range variable {
		if i == hexStep {
			norm = prefixed.ReplaceAllStringFunc(norm, ids)
			norm = hexRun.ReplaceAllStringFunc(norm, hex)
		}
		norm = v.re.ReplaceAllString(norm, v.with)
	}
	norm = once(whitespace.ReplaceAllString(norm, " "))
	if kind >= 0 {
		norm = typed[kind].kind(match) + ": " + strings.TrimSpace(typed[kind].drop(norm, match))
	}
	return errtext.Truncate(norm, MaxLen)
}

// once drops a label that repeats the one before it: "webhook: webhook:
// endpoint" is "webhook: endpoint".
func once(s string) string {
	parts := strings.Split(s, ": ")
	out := parts[:1]
	for _, p := range parts[1:] {
		if p != out[len(out)-1] {
			out = append(out, p)
		}
	}
	return strings.Join(out, ": ")
}

// All returns the classes of texts, in order.
func All(texts []string) []string {
	out := make([]string, len(texts))
	for i, t := range texts {
		out[i] = Of(t)
	}
	return out
}
