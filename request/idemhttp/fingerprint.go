package idemhttp

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"mime"
	nethttp "net/http"
	"strings"

	"github.com/idemq/idemq/request"
)

// FingerprintDefault tells requests apart by method, route, query and a
// digest of the canonical body. The route is the ServeMux pattern that
// matched (r.Pattern, when the middleware runs inside the mux's handler)
// or else the path. A JSON body (application/json or any +json type) is
// canonical when decoded and encoded again: key order and white space do
// not change the fingerprint, so a client that re-serialises its retry is
// still recognised. Other bodies are digested as sent.
func FingerprintDefault(r *nethttp.Request, body []byte) []byte {
	route := r.Pattern
	if route == "" {
		route = r.URL.EscapedPath()
	}
	digest := sha256.Sum256(canonicalBody(r.Header.Get("Content-Type"), body))
	return request.Fingerprint([]byte(r.Method), []byte(route), []byte(r.URL.Query().Encode()), digest[:])
}

// canonicalBody re-encodes a JSON body with sorted keys and no white
// space; numbers keep their text. Anything else, and JSON that does not
// parse, is returned as it is.
func canonicalBody(contentType string, body []byte) []byte {
	media, _, err := mime.ParseMediaType(contentType)
	if err != nil || (media != "application/json" && !strings.HasSuffix(media, "+json")) {
		return body
	}
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil || d.More() {
		return body
	}
	var b bytes.Buffer
	e := json.NewEncoder(&b)
	e.SetEscapeHTML(false)
	if err := e.Encode(v); err != nil {
		return body
	}
	return b.Bytes()
}
