package nats_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/relay/relaytest"
	idemqnats "github.com/idemq/idemq/transports/nats"
)

// The JetStreamSink passes the relay's Sink conformance suite on two
// subjects of one stream; the failing destination is a subject no stream
// captures.
func TestJetStreamSinkConformance(t *testing.T) {
	t.Parallel()
	relaytest.TestSink(t, func(t *testing.T) relaytest.Target {
		e := newEnv(t, jetstream.StreamConfig{})
		a, b := e.subject, e.n.Name("other")
		info, err := e.stream.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		cfg := info.Config
		cfg.Subjects = []string{a, b}
		if _, err := e.js.UpdateStream(context.Background(), cfg); err != nil {
			t.Fatal(err)
		}
		sink, err := idemqnats.NewJetStreamSink(e.js, idemqnats.SinkConfig{})
		if err != nil {
			t.Fatal(err)
		}
		return relaytest.Target{
			Sink:         sink,
			Destinations: []string{a, b},
			Failing:      e.n.Name("nowhere"),
			Received: func(ctx context.Context, subject string, n int) ([]relay.Message, error) {
				cons, err := e.stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
				if err != nil {
					return nil, err
				}
				var got []relay.Message
				for len(got) < n {
					m, err := cons.Next(jetstream.FetchContext(ctx))
					if err != nil {
						return got, err
					}
					got = append(got, outboxMessage(m.Subject(), m.Data(), m.Headers()))
				}
				return got, nil
			},
		}
	})
}

// The CoreSink passes the relay's Sink conformance suite on two subjects
// subscribed before anything is published; the failing destination maps to
// no subject.
func TestCoreSinkConformance(t *testing.T) {
	t.Parallel()
	relaytest.TestSink(t, func(t *testing.T) relaytest.Target {
		e := newEnv(t, jetstream.StreamConfig{})
		a, b := e.n.Name("core-a"), e.n.Name("core-b")
		sink, err := idemqnats.NewCoreSink(e.nc, idemqnats.SinkConfig{Subject: func(d string) string {
			if d == "fail" {
				return ""
			}
			return d
		}})
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		arrived := map[string][]relay.Message{}
		more := make(chan struct{}, 1)
		for _, subject := range []string{a, b} {
			sub, err := e.nc.Subscribe(subject, func(m *nats.Msg) {
				mu.Lock()
				arrived[m.Subject] = append(arrived[m.Subject], outboxMessage(m.Subject, m.Data, m.Header))
				mu.Unlock()
				select {
				case more <- struct{}{}:
				default:
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = sub.Unsubscribe() })
		}
		if err := e.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		return relaytest.Target{
			Sink:         sink,
			Destinations: []string{a, b},
			Failing:      "fail",
			Received: func(ctx context.Context, subject string, n int) ([]relay.Message, error) {
				for {
					mu.Lock()
					got := append([]relay.Message(nil), arrived[subject]...)
					mu.Unlock()
					if len(got) >= n {
						return got, nil
					}
					select {
					case <-ctx.Done():
						return got, errors.Join(ctx.Err(), errors.New("core NATS: messages missing"))
					case <-more:
					}
				}
			},
		}
	})
}

// outboxMessage turns a received NATS message back into the outbox message
// it carries.
func outboxMessage(subject string, data []byte, h nats.Header) relay.Message {
	m := outbox.Message{Destination: subject, Key: h.Get(idemqnats.HeaderKey), Payload: data, Headers: map[string]string{}}
	for k := range h {
		m.Headers[k] = h.Get(k)
	}
	m.ID, _ = uuid.Parse(h.Get(jetstream.MsgIDHeader))
	return relay.Message{Message: m}
}
