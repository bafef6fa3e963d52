package nats_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
	idemqnats "github.com/idemq/idemq/transports/nats"
)

// env is a NATS server with one stream capturing subject.
type env struct {
	n       *testenv.NATSServer
	nc      *nats.Conn
	js      jetstream.JetStream
	stream  jetstream.Stream
	subject string
}

func newEnv(t *testing.T, cfg jetstream.StreamConfig) *env {
	t.Helper()
	n := testenv.NATS(t)
	nc := n.ConnectTB(t)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	e := &env{n: n, nc: nc, js: js, subject: n.Name("orders")}
	cfg.Name = n.Name("ORDERS")
	cfg.Subjects = []string{e.subject}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if e.stream, err = n.CreateStream(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) msgs(t *testing.T) uint64 {
	t.Helper()
	info, err := e.stream.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func relayBatch(dest string, n int, keys int) []relay.Message {
	batch := make([]relay.Message, n)
	for i := range batch {
		batch[i] = relay.Message{Message: outbox.Message{ID: uuid.Must(uuid.NewV7()), Destination: dest, Key: fmt.Sprintf("k%d", i%keys),
			Payload: fmt.Appendf(nil, "m%d", i), Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}}
	}
	return batch
}

func TestJetStreamSinkStampsMessageIDAndHeaders(t *testing.T) {
	t.Parallel()
	e := newEnv(t, jetstream.StreamConfig{})
	sink, err := idemqnats.NewJetStreamSink(e.js, idemqnats.SinkConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	batch := relayBatch(e.subject, 50, 5)
	if err := sink.Publish(ctx, 0, batch); err != nil {
		t.Fatal(err)
	}
	if got := e.msgs(t); got != 50 {
		t.Fatalf("stream holds %d messages, want 50", got)
	}
	for i, m := range batch {
		raw, err := e.stream.GetMsg(ctx, uint64(i+1))
		if err != nil {
			t.Fatal(err)
		}
		if id := raw.Header.Get(jetstream.MsgIDHeader); id != m.ID.String() {
			t.Errorf("message %d: Nats-Msg-Id %q, want %s (stored out of relay order?)", i, id, m.ID)
		}
		if k := raw.Header.Get(idemqnats.HeaderKey); k != m.Key {
			t.Errorf("message %d: key header %q, want %q", i, k, m.Key)
		}
		if tp := raw.Header.Get("traceparent"); tp != m.Headers["traceparent"] {
			t.Errorf("message %d: traceparent %q not carried", i, tp)
		}
		if string(raw.Data) != string(m.Payload) {
			t.Errorf("message %d: payload %q, want %q", i, raw.Data, m.Payload)
		}
	}
}

// A relay that crashed between publish and delete publishes the same rows
// again; the stream's duplicate window drops them.
func TestJetStreamSinkDuplicateWindowDropsRelayRepublish(t *testing.T) {
	t.Parallel()
	e := newEnv(t, jetstream.StreamConfig{Duplicates: time.Minute})
	sink, err := idemqnats.NewJetStreamSink(e.js, idemqnats.SinkConfig{MaxInFlight: 8})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	batch := relayBatch(e.subject, 40, 4)
	if err := sink.Publish(ctx, 0, batch); err != nil {
		t.Fatal(err)
	}
	if err := sink.Publish(ctx, 0, batch[10:]); err != nil {
		t.Fatalf("republish: %v", err)
	}
	info, err := e.stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 40 || info.State.LastSeq != 40 {
		t.Fatalf("stream state after the republish: %d messages, last seq %d; want 40 and 40", info.State.Msgs, info.State.LastSeq)
	}
}

func TestJetStreamSinkClassifiesFailures(t *testing.T) {
	t.Parallel()
	e := newEnv(t, jetstream.StreamConfig{MaxMsgSize: 1024})
	sink, err := idemqnats.NewJetStreamSink(e.js, idemqnats.SinkConfig{
		Subject: func(d string) string {
			if d == "nowhere" {
				return ""
			}
			return d
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	id := func() uuid.UUID { return uuid.Must(uuid.NewV7()) }
	batch := []relay.Message{
		{Message: outbox.Message{ID: id(), Destination: e.subject, Key: "a", Payload: []byte("ok-1")}},
		{Message: outbox.Message{ID: id(), Destination: e.n.Name("unrouted"), Payload: []byte("no stream")}},
		{Message: outbox.Message{ID: id(), Destination: e.subject, Key: "b", Payload: make([]byte, 4096)}},      // over the stream's MaxMsgSize
		{Message: outbox.Message{ID: id(), Destination: e.subject, Key: "c", Payload: make([]byte, 2<<20)}},     // over the server's max payload
		{Message: outbox.Message{ID: id(), Destination: e.subject, Key: "c", Payload: []byte("after too big")}}, // must not overtake
		{Message: outbox.Message{ID: id(), Destination: "nowhere", Payload: []byte("x")}},
		{Message: outbox.Message{ID: id(), Destination: e.subject, Key: "a", Payload: []byte("ok-2")}},
	}
	err = sink.Publish(context.Background(), 0, batch)
	var perr *relay.PublishError
	if !errors.As(err, &perr) {
		t.Fatalf("Publish = %v, want a *relay.PublishError", err)
	}
	for i, want := range []struct {
		failed, permanent bool
		is                error
	}{
		{}, {true, false, jetstream.ErrNoStreamResponse}, {true, true, jetstream.ErrStreamMessageExceedsMaximum},
		{true, true, nats.ErrMaxPayload}, {true, false, relay.ErrSkipped}, {true, true, idemqnats.ErrNoSubject}, {},
	} {
		got, failed := perr.Failed[i]
		if failed != want.failed {
			t.Errorf("message %d: failed=%v (%v), want %v", i, failed, got, want.failed)
			continue
		}
		if !failed {
			continue
		}
		if idemq.IsPermanent(got) != want.permanent || !errors.Is(got, want.is) {
			t.Errorf("message %d: error %v (permanent %v), want permanent=%v and errors.Is %v", i, got, idemq.IsPermanent(got), want.permanent, want.is)
		}
	}
	if got := e.msgs(t); got != 2 {
		t.Fatalf("stream holds %d messages, want the 2 good ones", got)
	}
}

func TestJetStreamSinkCancelledContext(t *testing.T) {
	t.Parallel()
	e := newEnv(t, jetstream.StreamConfig{})
	sink, err := idemqnats.NewJetStreamSink(e.js, idemqnats.SinkConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := sink.Publish(ctx, 0, relayBatch(e.subject, 3, 1)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Publish on a cancelled context = %v, want context.Canceled", err)
	}
}

func TestCoreSinkPublishes(t *testing.T) {
	t.Parallel()
	n := testenv.NATS(t)
	nc := n.ConnectTB(t)
	subject := n.Name("events")
	sub, err := nc.SubscribeSync(subject)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	sink, err := idemqnats.NewCoreSink(nc, idemqnats.SinkConfig{})
	if err != nil {
		t.Fatal(err)
	}
	batch := relayBatch(subject, 5, 2)
	big := relay.Message{Message: outbox.Message{ID: uuid.Must(uuid.NewV7()), Destination: subject, Payload: make([]byte, 2<<20)}}
	err = sink.Publish(context.Background(), 0, append(batch, big))
	var perr *relay.PublishError
	if !errors.As(err, &perr) || len(perr.Failed) != 1 || !idemq.IsPermanent(perr.Failed[5]) {
		t.Fatalf("Publish = %v, want only the oversized message failed permanently", err)
	}
	for i, m := range batch {
		got, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if id := got.Header.Get(jetstream.MsgIDHeader); id != m.ID.String() {
			t.Errorf("message %d: Nats-Msg-Id %q, want %s", i, id, m.ID)
		}
	}
}

func TestNewSinkRejectsBadConfig(t *testing.T) {
	t.Parallel()
	if _, err := idemqnats.NewJetStreamSink(nil, idemqnats.SinkConfig{}); !errors.Is(err, idemq.ErrConfig) {
		t.Errorf("nil JetStream: %v", err)
	}
	if _, err := idemqnats.NewCoreSink(nil, idemqnats.SinkConfig{}); !errors.Is(err, idemq.ErrConfig) {
		t.Errorf("nil conn: %v", err)
	}
	n := testenv.NATS(t)
	nc := n.ConnectTB(t)
	if _, err := idemqnats.NewCoreSink(nc, idemqnats.SinkConfig{MaxInFlight: -1}); !errors.Is(err, idemq.ErrConfig) || !strings.Contains(err.Error(), "negative") {
		t.Errorf("negative MaxInFlight: %v", err)
	}
}
