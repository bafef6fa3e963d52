package webhook

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"time"

	"code.dny.dev/ssrf"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/transports/webhook/endpoints"
	"github.com/idemq/idemq/transports/webhook/signing"
)

// HeaderIdempotencyKey carries the webhook-id once more on every
// delivery, under the name idemq's other transports and request
// middleware use, so a receiver that deduplicates by Idempotency-Key
// needs nothing webhook-specific.
const HeaderIdempotencyKey = "Idempotency-Key"

// newClient returns the delivery client: the SSRF guard on every dial (it
// sees the resolved address, so a DNS name pointing inside and a redirect
// target are both caught), no redirects, no proxy from the environment.
func newClient(allowed []netip.Prefix) *http.Client {
	var v4, v6 []netip.Prefix
	for _, p := range allowed {
		if p.Addr().Is4() {
			v4 = append(v4, p)
		} else {
			v6 = append(v6, p)
		}
	}
	guard := ssrf.New(ssrf.WithAnyPort(), ssrf.WithAllowedV4Prefixes(v4...), ssrf.WithAllowedV6Prefixes(v6...))
	control := func(network, address string, conn syscall.RawConn) error {
		if err := guard.Safe(network, address, conn); err != nil {
			return fmt.Errorf("%w: the SSRF guard refuses private and special-purpose addresses; "+
				"allow this one with webhook.Config.AllowedNetworks (idemq relay --webhook-allow-network)", err)
		}
		return nil
	}
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second, Control: control}
	return &http.Client{
		Transport: &http.Transport{
			DialContext:         dialer.DialContext,
			ForceAttemptHTTP2:   true,
			MaxIdleConns:        1024,
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     90 * time.Second,
			TLSHandshakeTimeout: 10 * time.Second,
		},
		// A 3xx is a failed delivery (Standard Webhooks): never follow it.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// DeliveryError is the error of a delivery that did not get a 2xx: the
// relay stores its text with the retry or the dead letter.
type DeliveryError struct {
	// Endpoint is the endpoint's id.
	Endpoint string
	// Status is the HTTP status, 0 when no response arrived.
	Status int
	// Body holds the first bytes of the response body.
	Body []byte
	// Err is the transport error when no response arrived, or the
	// receiver's request not to retry ("webhook-delivery: abort-message").
	Err error
}

func (e *DeliveryError) Error() string {
	if e.Status == 0 {
		return fmt.Sprintf("webhook: endpoint %s: %v", e.Endpoint, e.Err)
	}
	s := fmt.Sprintf("webhook: endpoint %s: HTTP %d", e.Endpoint, e.Status)
	if len(e.Body) > 0 {
		s += ": " + strings.ToValidUTF8(string(e.Body), "?")
	}
	return s
}

func (e *DeliveryError) Unwrap() error { return e.Err }

type outcome int

const (
	outcomeDelivered outcome = iota
	outcomeRetry             // 3xx, 408, 425, 429, 5xx, timeouts, connection errors
	outcomePermanent         // other 4xx, refused by the SSRF guard, abort-message
	outcomeGone              // 410: disable the endpoint
	outcomeHeld              // not attempted
)

// classify maps post's result to an outcome.
func classify(status int, err error) outcome {
	var de *DeliveryError
	switch {
	case err == nil:
		return outcomeDelivered
	case status == http.StatusGone:
		return outcomeGone
	case errors.As(err, &de) && errors.Is(de.Err, errAbort):
		return outcomePermanent
	case status == 0 && isRefused(err):
		return outcomePermanent
	case status == 0, status < 400, status >= 500,
		status == http.StatusRequestTimeout, status == http.StatusTooEarly, status == http.StatusTooManyRequests:
		return outcomeRetry
	}
	return outcomePermanent
}

// isRefused reports an SSRF guard refusal: the endpoint's address is not
// allowed, which no retry changes.
func isRefused(err error) bool {
	return errors.Is(err, ssrf.ErrProhibitedIP) || errors.Is(err, ssrf.ErrProhibitedNetwork) || errors.Is(err, ssrf.ErrProhibitedPort)
}

// errAbort reports a receiver that answered with "webhook-delivery:
// abort-message" (Svix): it asks not to retry the message.
var errAbort = errors.New("receiver asked to abort the message")

// post sends one delivery and returns the status and, unless 2xx, a
// *DeliveryError (wrapped with idemq.RetryAfter when the receiver said when
// to come back).
func (s *Sink) post(ctx context.Context, ep endpoints.Endpoint, keys []signing.Key, m relay.Message) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(ep.Timeout, s.cfg.Timeout))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ep.URL, bytes.NewReader(m.Payload))
	if err != nil {
		return 0, &DeliveryError{Endpoint: ep.ID, Err: err}
	}
	id := m.ID.String()
	now := time.Now()
	for name, v := range m.Headers {
		// The message's own headers (content type, trace context) travel
		// along; the ones the Sink sets win.
		req.Header.Set(name, v)
	}
	if req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("User-Agent", s.cfg.UserAgent)
	req.Header.Set(signing.HeaderID, id)
	req.Header.Set(signing.HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
	req.Header.Set(signing.HeaderSignature, signing.Sign(keys, id, now, m.Payload))
	req.Header.Set(HeaderIdempotencyKey, id)
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, &DeliveryError{Endpoint: ep.ID, Err: err}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, int64(s.cfg.MaxResponseBody)))
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return resp.StatusCode, nil
	}
	de := &DeliveryError{Endpoint: ep.ID, Status: resp.StatusCode, Body: body[:min(len(body), s.cfg.ErrorBody)]}
	if strings.EqualFold(resp.Header.Get("webhook-delivery"), "abort-message") {
		de.Err = errAbort
	}
	if d, ok := retryAfter(resp.Header.Get("Retry-After"), now); ok {
		return resp.StatusCode, idemq.RetryAfter(de, min(d, s.cfg.MaxRetryAfter))
	}
	return resp.StatusCode, de
}

// retryAfter parses a Retry-After value: delay seconds or an HTTP date.
func retryAfter(v string, now time.Time) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil && secs >= 0 {
		return time.Duration(min(secs, math.MaxInt64/int64(time.Second))) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}
