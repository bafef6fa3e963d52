package webhook_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/lifecycle"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/transports/transporttest"
	"github.com/idemq/idemq/transports/webhook"
	"github.com/idemq/idemq/transports/webhook/endpoints"
	"github.com/idemq/idemq/transports/webhook/signing"
)

// TestReceiverConformance runs the transport conformance suite against the
// Receiver. A webhook's "broker" is its sender: the harness holds the
// published messages and sends them as a Standard Webhooks sender does,
// signed, one after the other, each until a 2xx or a final 4xx (as the
// Sink classifies them), again after a dropped connection. A group is a
// sender's position in that log; a subscription is a Receiver on its own
// HTTP server, fed by the sender of its group.
func TestReceiverConformance(t *testing.T) {
	transporttest.Run(t, func(t *testing.T) transporttest.Harness { return newWebhookHarness(t, signing.NewSecret()) })
}

type webhookHarness struct {
	t    *testing.T
	keys []signing.Key
	ring string

	mu    sync.Mutex
	log   []transporttest.Message
	moved chan struct{}  // closed and replaced when log grows
	next  map[string]int // group -> index of its next message
}

// newWebhookHarness returns a harness whose sender signs with secret.
func newWebhookHarness(t *testing.T, secret string) *webhookHarness {
	keys, err := signing.ParseKeys(secret)
	if err != nil {
		t.Fatal(err)
	}
	return &webhookHarness{t: t, keys: keys, ring: secret, moved: make(chan struct{}), next: map[string]int{}}
}

func (h *webhookHarness) Features() transporttest.Features {
	// The sender redelivers what got no answer; there are no shared groups
	// or batches in HTTP. The order of concurrent requests is not the
	// Receiver's to keep, but this sender posts a group's messages one at
	// a time, as a relay posts a key's, and a message the Receiver did
	// not take (a 5xx) holds back the ones behind it.
	return transporttest.Features{Redelivery: true, RequiresID: true, OrderedPerKey: true}
}

func (h *webhookHarness) Publish(_ context.Context, msgs ...transporttest.Message) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.log = append(h.log, msgs...)
	close(h.moved)
	h.moved = make(chan struct{})
	return nil
}

// Sink is the relay's way into the sender's log: webhook-id = outbox id,
// as the webhook Sink sends it (whose own suite is TestSinkConformance).
func (h *webhookHarness) Sink() (relay.Sink, string) {
	return relay.SinkFunc(func(ctx context.Context, _ relay.BatchID, batch []relay.Message) error {
		msgs := make([]transporttest.Message, len(batch))
		for i, m := range batch {
			msgs[i] = transporttest.Message{ID: m.ID.String(), Key: m.Key, Payload: m.Payload}
		}
		return h.Publish(ctx, msgs...)
	}), endpoints.DestinationPrefix + "conformance"
}

func (h *webhookHarness) DeadLetters(context.Context) ([]string, error) {
	return nil, errors.New("webhooks have no dead-letter destination")
}

func (h *webhookHarness) Subscriber(c *consumer.Consumer, opts transporttest.SubscribeOptions) idemq.Service {
	return &webhookSubscription{h: h, c: c, opts: opts}
}

// webhookSubscription is a Receiver on its own server and the sender of
// its group posting to it.
type webhookSubscription struct {
	h     *webhookHarness
	c     *consumer.Consumer
	opts  transporttest.SubscribeOptions
	state lifecycle.State
}

func (s *webhookSubscription) Ready() <-chan struct{} { return s.state.Ready() }

func (s *webhookSubscription) Run(ctx context.Context) error {
	ready, end, err := s.state.Begin()
	if err != nil {
		return err
	}
	defer end()
	ctx, crash := context.WithCancelCause(ctx)
	defer crash(nil)
	cfg := webhook.ReceiverConfig{Keys: []string{s.h.ring}, Logger: s.opts.Logger}
	if hook := s.opts.BeforeAck(); hook != nil {
		cfg.Test.BeforeAnswer = func(ctx context.Context, msgs []*consumer.Message, results []consumer.Result) error {
			err := hook(ctx, msgs, results)
			if err != nil {
				crash(err) // the process dies: nothing more is answered or sent
			}
			return err
		}
	}
	recv, err := webhook.NewReceiver(s.c, cfg)
	if err != nil {
		return err
	}
	srv := httptest.NewServer(recv)
	defer srv.Close()
	ready()
	s.h.send(ctx, s.opts.Group, srv.URL)
	if err := context.Cause(ctx); !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// send posts the group's messages to url in log order until ctx is done;
// a message is done on a 2xx or a final 4xx.
func (h *webhookHarness) send(ctx context.Context, group, url string) {
	for {
		h.mu.Lock()
		i, moved := h.next[group], h.moved
		var m transporttest.Message
		pending := i < len(h.log)
		if pending {
			m = h.log[i]
		}
		h.mu.Unlock()
		if !pending {
			select {
			case <-ctx.Done():
				return
			case <-moved:
				continue
			}
		}
		for !h.post(ctx, url, m) {
			select {
			case <-ctx.Done():
				return
			case <-time.After(10 * time.Millisecond): // a fast retry schedule
			}
		}
		if ctx.Err() != nil {
			return // answered, but the subscription died before it noted it
		}
		h.mu.Lock()
		h.next[group] = i + 1
		h.mu.Unlock()
	}
}

// post sends m once, signed, and reports whether the sender is done with
// it.
func (h *webhookHarness) post(ctx context.Context, url string, m transporttest.Message) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(m.Payload))
	if err != nil {
		h.t.Errorf("webhook harness: %v", err)
		return true
	}
	now := time.Now()
	if m.ID != "" {
		req.Header.Set(signing.HeaderID, m.ID)
	}
	req.Header.Set(signing.HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
	req.Header.Set(signing.HeaderSignature, signing.Sign(h.keys, m.ID, now, m.Payload))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false // no answer: send it again
	}
	resp.Body.Close()
	switch code := resp.StatusCode; {
	case code < 300:
		return true
	case code == http.StatusRequestTimeout, code == http.StatusTooEarly, code == http.StatusTooManyRequests:
		return false
	default:
		return code >= 400 && code < 500 // a final refusal; 3xx and 5xx are retried
	}
}
