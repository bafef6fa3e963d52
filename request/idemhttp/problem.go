package idemhttp

import (
	"encoding/json"
	"math"
	nethttp "net/http"
	"strconv"
	"time"
)

// The problem types of the middleware's RFC 9457 error responses. Each
// URI is a section of problems.md in idemq's repository, which says what
// the client should do. The draft defines no registered types; clients
// should switch on the status code and may use the type for detail.
const (
	problemBase = "https://github.com/idemq/idemq/blob/main/request/idemhttp/problems.md#"

	// ProblemKeyMissing (400): a protected route got no Idempotency-Key.
	// Send one: a UUID per logical operation, reused on every retry.
	ProblemKeyMissing = problemBase + "key-missing"
	// ProblemKeyMalformed (400): the key is not an sf-string (or, unless
	// strict, a bare token), is longer than the limit (255 bytes by
	// default) or not of the required form (UUID or ULID, if configured).
	ProblemKeyMalformed = problemBase + "key-malformed"
	// ProblemKeyReused (422): the key was first used for another request
	// (method, route, query or body differ). Do not retry; send a new key
	// for a new operation.
	ProblemKeyReused = problemBase + "key-reused"
	// ProblemInFlight (409): the first request with this key is still
	// being processed. Retry with the same key after Retry-After seconds.
	ProblemInFlight = problemBase + "in-flight"
	// ProblemUnavailable (503): the key store cannot be reached, so the
	// request was not run. Retry with the same key after Retry-After.
	ProblemUnavailable = problemBase + "unavailable"
	// ProblemNotCommitted (500): the handler recorded its response in a
	// transaction that then rolled back, so nothing was done. Retry with
	// the same key.
	ProblemNotCommitted = problemBase + "not-committed"
	// ProblemBodyTooLarge (413): the request body is over the limit the
	// middleware reads to fingerprint it.
	ProblemBodyTooLarge = problemBase + "body-too-large"
	// ProblemMisconfigured (500): the server derived a scope or a
	// fingerprint its store cannot take, or its store is set up wrong; the
	// request was not run and the reason is in the server's log. Retrying
	// does not help until the operator fixes it.
	ProblemMisconfigured = problemBase + "misconfigured"
	// ProblemResponseNotKept (410): the request with this key ran and its
	// outcome stands (original_status), but its response body was over the
	// size kept for replay. Do not retry: read the result another way, such
	// as a GET of the Location the problem carries.
	ProblemResponseNotKept = problemBase + "response-not-kept"
)

// problem is an RFC 9457 problem details object.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Key is the idempotency key the problem is about, when there is one.
	Key string `json:"idempotency_key,omitempty"`
	// OriginalStatus is the status of the response that was not kept.
	OriginalStatus int `json:"original_status,omitempty"`
}

var titles = map[string]string{
	ProblemKeyMissing:      "Idempotency-Key is missing",
	ProblemKeyMalformed:    "Idempotency-Key is malformed",
	ProblemKeyReused:       "Idempotency-Key is already used",
	ProblemInFlight:        "A request is outstanding for this Idempotency-Key",
	ProblemUnavailable:     "Idempotency-Key store is unavailable",
	ProblemBodyTooLarge:    "Request body is too large",
	ProblemNotCommitted:    "The request's transaction did not commit",
	ProblemMisconfigured:   "The server's idempotency configuration is broken",
	ProblemResponseNotKept: "The response to this Idempotency-Key was too large to keep",
}

// writeProblem answers with an application/problem+json body; retryAfter
// > 0 adds a Retry-After header in whole seconds, rounded up.
func writeProblem(w nethttp.ResponseWriter, typ string, status int, key, detail string, retryAfter time.Duration) {
	problem{Type: typ, Title: titles[typ], Status: status, Detail: detail, Key: key}.write(w, retryAfter)
}

func (p problem) write(w nethttp.ResponseWriter, retryAfter time.Duration) {
	body, _ := json.Marshal(p)
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Language", "en")
	if retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(int(math.Ceil(retryAfter.Seconds()))))
	}
	w.WriteHeader(p.Status)
	_, _ = w.Write(body)
}
