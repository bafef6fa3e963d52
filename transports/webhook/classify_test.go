package webhook_test

import (
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/transports/webhook"
	"github.com/idemq/idemq/transports/webhook/endpoints"
)

// TestClassification answers one delivery per status from a real server
// and checks what the Sink makes of it: delivered, retryable (with the
// Retry-After, bounded), permanent, or held after disabling the endpoint.
func TestClassification(t *testing.T) {
	t.Parallel()
	b := setup(t)
	type want int
	const (
		delivered want = iota
		retry
		permanent
		held
	)
	cases := []struct {
		status     int
		header     http.Header
		want       want
		retryAfter time.Duration
	}{
		{status: 200, want: delivered},
		{status: 204, want: delivered},
		{status: 301, header: http.Header{"Location": {"https://example.com"}}, want: retry},
		{status: 304, want: retry},
		{status: 400, want: permanent},
		{status: 401, want: permanent},
		{status: 404, want: permanent},
		{status: 408, want: retry},
		{status: 409, want: permanent},
		{status: 410, want: held},
		{status: 422, want: permanent},
		{status: 425, want: retry},
		{status: 429, header: http.Header{"Retry-After": {"7"}}, want: retry, retryAfter: 7 * time.Second},
		{status: 429, header: http.Header{"Retry-After": {"86400"}}, want: retry, retryAfter: time.Minute}, // bounded by MaxRetryAfter
		{status: 503, header: http.Header{"Retry-After": {time.Now().Add(time.Hour).UTC().Format(http.TimeFormat)}}, want: retry, retryAfter: time.Minute},
		{status: 500, want: retry},
		{status: 502, want: retry},
		{status: 500, header: http.Header{"Webhook-Delivery": {"abort-message"}}, want: permanent},
	}
	sink := fastSink(t, b, webhook.Config{MaxRetryAfter: time.Minute, BreakerFailures: 1000})
	for i, c := range cases {
		rc := newReceiver(t, func(_ int, w http.ResponseWriter, _ *http.Request) bool {
			for k, v := range c.header {
				w.Header()[k] = v
			}
			w.WriteHeader(c.status)
			return true
		})
		ep, _ := addEndpoint(t, b, rc.srv.URL, nil)
		m := relay.Message{Message: outbox.Message{ID: uuid.Must(uuid.NewV7()), Destination: endpoints.DestinationPrefix + ep.ID, Payload: []byte(`{}`)}}
		err := sink.Publish(b.ctx, 0, []relay.Message{m})
		var pe *relay.PublishError
		if err != nil && errors.As(err, &pe) {
			err = pe.Failed[0]
		}
		name := fmt.Sprintf("case %d (%d %v)", i, c.status, c.header)
		hint, hasHint := idemq.RetryAfterHint(err)
		switch {
		case c.want == delivered && err != nil,
			c.want == retry && (err == nil || idemq.IsPermanent(err) || errors.Is(err, relay.ErrSkipped)),
			c.want == permanent && !idemq.IsPermanent(err),
			c.want == held && !errors.Is(err, webhook.ErrHeld):
			t.Errorf("%s: %v, want outcome %d", name, err, c.want)
		case c.retryAfter > 0 && (!hasHint || hint < c.retryAfter-time.Second || hint > c.retryAfter):
			t.Errorf("%s: retry after %v, want %v", name, hint, c.retryAfter)
		case rc.count() != 1:
			t.Errorf("%s: %d requests, want 1", name, rc.count())
		}
	}
}
