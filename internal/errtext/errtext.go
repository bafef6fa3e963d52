// Package errtext is the one rule for storing and sending error text: cut
// to a bounded length without splitting a UTF-8 sequence, so a dead-letter
// header, an inbox last_error or an outbox last_error is always valid text
// of a known size.
package errtext

import (
	"strings"
	"unicode/utf8"
)

// MaxLen bounds error text kept in a table column or a message header, in
// bytes.
const MaxLen = 4096

// Of returns the text of err cut to MaxLen bytes, or "" for a nil err.
func Of(err error) string {
	if err == nil {
		return ""
	}
	return Truncate(err.Error(), MaxLen)
}

// Truncate cuts s to at most n bytes without splitting a UTF-8 sequence;
// invalid bytes in s are dropped, so the result is always valid UTF-8.
func Truncate(s string, n int) string {
	s = strings.ToValidUTF8(s, "")
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:max(n, 0)]
}
