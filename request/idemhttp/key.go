package idemhttp

import (
	"errors"
	"fmt"
	nethttp "net/http"
	"strings"

	"github.com/idemq/idemq/request"
)

// HeaderKey is the request header that carries the idempotency key.
const HeaderKey = "Idempotency-Key"

var errNoKey = errors.New("no Idempotency-Key header")

// parseKey reads the Idempotency-Key header: an RFC 9651 sf-string
// ("\"8e03978e-…\""), or, unless strict, a bare value as Stripe's clients
// send it. Two field lines make a list, which is not a key. The result is
// only checked for syntax; request.KeyRules judge its length and form.
func parseKey(h nethttp.Header, strict bool) (string, error) {
	lines := h.Values(HeaderKey)
	switch {
	case len(lines) == 0:
		return "", errNoKey
	case len(lines) > 1:
		return "", fmt.Errorf("%w: the header appears %d times; send it once", request.ErrInvalidKey, len(lines))
	}
	v := strings.Trim(lines[0], " \t")
	if strings.HasPrefix(v, `"`) {
		return parseString(v)
	}
	if strict {
		return "", fmt.Errorf(`%w: want a structured-field string such as "8e03978e-40d5-43e8-bc93-6894a57f9324", quotes included`, request.ErrInvalidKey)
	}
	for i := 0; i < len(v); i++ {
		if v[i] <= 0x20 || v[i] >= 0x7f || v[i] == '"' || v[i] == '\\' || v[i] == ',' {
			return "", fmt.Errorf("%w: a bare key may hold printable ASCII other than space, quote, backslash and comma; quote it as a string otherwise", request.ErrInvalidKey)
		}
	}
	return v, nil
}

// parseString parses a whole field value as an sf-string (RFC 9651
// section 4.2.5): printable ASCII between quotes, with \" and \\ the only
// escapes, and nothing after the closing quote.
func parseString(v string) (string, error) {
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", fmt.Errorf(`%w: only \" and \\ may be escaped in a string`, request.ErrInvalidKey)
			}
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", fmt.Errorf("%w: text after the closing quote", request.ErrInvalidKey)
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("%w: a string holds printable ASCII only", request.ErrInvalidKey)
		default:
			b.WriteByte(c)
		}
	}
	return "", fmt.Errorf("%w: no closing quote", request.ErrInvalidKey)
}
