package nats_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	idemqnats "github.com/idemq/idemq/transports/nats"
)

// The bad-input suite of the NATS transport (issue 23): each careless
// argument or setting gets an idemq.ErrConfig naming it at construction,
// never a panic, a busy loop or a subscription that can never work; a
// message with an empty id is dead-lettered, not applied under "".

// wantConfigError fails unless err is an idemq.ErrConfig naming field.
func wantConfigError(t *testing.T, what string, err error, field string) {
	t.Helper()
	ce, ok := errors.AsType[*idemq.ConfigError](err)
	if !ok || !errors.Is(err, idemq.ErrConfig) || ce.Field != field {
		t.Errorf("%s: %v, want an idemq.ErrConfig naming %s", what, err, field)
	}
}

// TestBadInputTypedNilArguments: nil and typed-nil arguments to every
// constructor (commit 33995b9) are refused with an idemq.ErrConfig, no
// panic, as is a connection already closed.
func TestBadInputTypedNilArguments(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	c := w.consumer(consumer.Config{}, nil)
	cons := w.durable("d", jetstream.ConsumerConfig{})
	var (
		nilConsumer *consumer.Consumer
		nilConn     *nats.Conn
		typedCons   jetstream.Consumer  = (*nilJSConsumer)(nil)
		typedJS     jetstream.JetStream = (*nilJetStream)(nil)
	)
	closed := w.e.n.ConnectTB(t)
	closed.Close()

	_, err := idemqnats.NewJetStreamSubscriber(nilConsumer, cons, w.e.js, idemqnats.JetStreamSubscriberConfig{})
	wantConfigError(t, "NewJetStreamSubscriber(nil consumer)", err, "consumer")
	for name, cs := range map[string]jetstream.Consumer{"nil": nil, "typed nil": typedCons} {
		_, err := idemqnats.NewJetStreamSubscriber(c, cs, w.e.js, idemqnats.JetStreamSubscriberConfig{})
		wantConfigError(t, "NewJetStreamSubscriber("+name+" cons)", err, "cons")
	}
	for name, js := range map[string]jetstream.JetStream{"nil": nil, "typed nil": typedJS} {
		_, err := idemqnats.NewJetStreamSubscriber(c, cons, js, idemqnats.JetStreamSubscriberConfig{DeadLetterSubject: w.e.n.Name("dlq")})
		wantConfigError(t, "NewJetStreamSubscriber("+name+" js, DeadLetterSubject)", err, "DeadLetterSubject")
		_, err = idemqnats.NewJetStreamSink(js, idemqnats.SinkConfig{})
		wantConfigError(t, "NewJetStreamSink("+name+" js)", err, "js")
	}
	_, err = idemqnats.NewCoreSubscriber(nilConsumer, w.e.nc, "orders", idemqnats.CoreSubscriberConfig{})
	wantConfigError(t, "NewCoreSubscriber(nil consumer)", err, "consumer")
	for name, nc := range map[string]*nats.Conn{"nil": nilConn, "closed": closed} {
		_, err := idemqnats.NewCoreSubscriber(c, nc, "orders", idemqnats.CoreSubscriberConfig{})
		wantConfigError(t, "NewCoreSubscriber("+name+" nc)", err, "nc")
		_, err = idemqnats.NewCoreSink(nc, idemqnats.SinkConfig{})
		wantConfigError(t, "NewCoreSink("+name+" nc)", err, "nc")
	}
}

// TestBadInputDurations: durations below 1ms (a fetch that expires before
// the server answers, progress reports or acknowledgement timeouts in a
// busy loop) and negative ones are refused, naming the field; zero is the
// default and 1ms is accepted.
func TestBadInputDurations(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	c := w.consumer(consumer.Config{}, nil)
	cons := w.durable("d", jetstream.ConsumerConfig{AckWait: 30 * time.Second})
	bad := []time.Duration{time.Nanosecond, 999 * time.Microsecond, -time.Second}
	for field, set := range map[string]func(*idemqnats.JetStreamSubscriberConfig, time.Duration){
		"FetchWait":          func(c *idemqnats.JetStreamSubscriberConfig, d time.Duration) { c.FetchWait = d },
		"InProgressInterval": func(c *idemqnats.JetStreamSubscriberConfig, d time.Duration) { c.InProgressInterval = d },
	} {
		for _, d := range append(bad, 0, time.Millisecond) {
			var cfg idemqnats.JetStreamSubscriberConfig
			set(&cfg, d)
			_, err := idemqnats.NewJetStreamSubscriber(c, cons, w.e.js, cfg)
			if d == 0 || d == time.Millisecond {
				if err != nil {
					t.Errorf("%s = %v: %v, want it accepted", field, d, err)
				}
				continue
			}
			wantConfigError(t, field+" = "+d.String(), err, field)
		}
	}
	for _, d := range append(bad, 0, time.Millisecond) {
		_, jerr := idemqnats.NewJetStreamSink(w.e.js, idemqnats.SinkConfig{AckTimeout: d})
		_, cerr := idemqnats.NewCoreSink(w.e.nc, idemqnats.SinkConfig{AckTimeout: d})
		for _, err := range []error{jerr, cerr} {
			if d == 0 || d == time.Millisecond {
				if err != nil {
					t.Errorf("AckTimeout = %v: %v, want it accepted", d, err)
				}
				continue
			}
			wantConfigError(t, "AckTimeout = "+d.String(), err, "AckTimeout")
		}
	}
	for _, err := range []error{
		func() error {
			_, err := idemqnats.NewJetStreamSubscriber(c, cons, w.e.js, idemqnats.JetStreamSubscriberConfig{ShutdownGrace: -time.Second})
			return err
		}(),
		func() error {
			_, err := idemqnats.NewCoreSubscriber(c, w.e.nc, "orders", idemqnats.CoreSubscriberConfig{ShutdownGrace: -time.Second})
			return err
		}(),
	} {
		wantConfigError(t, "ShutdownGrace = -1s", err, "ShutdownGrace")
	}
	_, err := idemqnats.NewJetStreamSink(w.e.js, idemqnats.SinkConfig{MaxInFlight: -1})
	wantConfigError(t, "MaxInFlight = -1", err, "MaxInFlight")
	for field, r := range map[string]idemq.Retry{
		"Retry.BaseDelay": {BaseDelay: -time.Second},
		"Retry.MaxDelay":  {MaxDelay: -time.Second},
	} {
		_, err := idemqnats.NewCoreSubscriber(c, w.e.nc, "orders", idemqnats.CoreSubscriberConfig{Retry: r})
		wantConfigError(t, "core subscriber "+field+" = -1s", err, field)
	}
}

// TestBadInputBatchAboveTheConsumersLimit: a MaxBatch above the JetStream
// consumer's MaxRequestBatch (the default 100 above a limit of 10, too)
// made the server refuse every fetch, which Run retried forever; it is
// refused at construction, and the limit itself is accepted.
func TestBadInputBatchAboveTheConsumersLimit(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	c := w.consumer(consumer.Config{}, nil)
	cons := w.durable("small", jetstream.ConsumerConfig{MaxRequestBatch: 10})
	for _, n := range []int{0, 11, -1} {
		_, err := idemqnats.NewJetStreamSubscriber(c, cons, w.e.js, idemqnats.JetStreamSubscriberConfig{MaxBatch: n})
		wantConfigError(t, fmt.Sprintf("MaxBatch = %d", n), err, "MaxBatch")
	}
	if _, err := idemqnats.NewJetStreamSubscriber(c, cons, w.e.js, idemqnats.JetStreamSubscriberConfig{MaxBatch: 10}); err != nil {
		t.Fatalf("MaxBatch = MaxRequestBatch: %v, want it accepted", err)
	}
}

// TestBadInputSubjectsAndNames: a subject the server would refuse, a
// wildcard dead-letter subject (a publish goes to one subject), a queue
// group with a blank and an id header no message can carry are refused at
// construction instead of failing every Run or every dead letter.
func TestBadInputSubjectsAndNames(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	c := w.consumer(consumer.Config{}, nil)
	cons := w.durable("d", jetstream.ConsumerConfig{})
	for _, subject := range []string{"", "orders created", "orders.", ".orders", "orders..created", "orders.>.created", "orders\t"} {
		_, err := idemqnats.NewCoreSubscriber(c, w.e.nc, subject, idemqnats.CoreSubscriberConfig{})
		wantConfigError(t, "NewCoreSubscriber(subject "+subject+")", err, "subject")
	}
	for _, subject := range []string{"orders.*", "orders.>", ">", "orders.created"} {
		if _, err := idemqnats.NewCoreSubscriber(c, w.e.nc, subject, idemqnats.CoreSubscriberConfig{}); err != nil {
			t.Errorf("NewCoreSubscriber(subject %q): %v, want it accepted", subject, err)
		}
	}
	for _, subject := range []string{"dlq orders", "dlq.*", "dlq.>", "dlq..x"} {
		_, err := idemqnats.NewJetStreamSubscriber(c, cons, w.e.js, idemqnats.JetStreamSubscriberConfig{DeadLetterSubject: subject})
		wantConfigError(t, "DeadLetterSubject "+subject, err, "DeadLetterSubject")
	}
	_, err := idemqnats.NewCoreSubscriber(c, w.e.nc, "orders", idemqnats.CoreSubscriberConfig{Queue: "workers 1"})
	wantConfigError(t, "Queue with a blank", err, "Queue")
	for _, header := range []string{"Msg Id", "Msg-Id:", "Msg-Id\n"} {
		_, err := idemqnats.NewCoreSubscriber(c, w.e.nc, "orders", idemqnats.CoreSubscriberConfig{IDHeader: header})
		wantConfigError(t, "core IDHeader "+header, err, "IDHeader")
		_, err = idemqnats.NewJetStreamSubscriber(c, cons, w.e.js, idemqnats.JetStreamSubscriberConfig{IDHeader: header})
		wantConfigError(t, "JetStream IDHeader "+header, err, "IDHeader")
	}
}

// TestBadInputEmptyMessageID: a message whose id header is there but
// empty is dead-lettered with consumer.ErrInvalidMessage, on JetStream
// (unless FallbackOnInvalidID) and on core NATS, never applied under the
// key "".
func TestBadInputEmptyMessageID(t *testing.T) {
	t.Parallel()
	const header = "Order-Id" // not Nats-Msg-Id, which the stream reads itself
	w := newWorld(t)
	c := w.consumer(consumer.Config{}, nil)
	var (
		results = make(chan consumer.Result, 4)
		record  = idemqnats.TestConfig{BeforeAck: func(_ context.Context, _ []*consumer.Message, rs []consumer.Result) error {
			for _, r := range rs {
				results <- r
			}
			return nil
		}}
	)
	next := func() consumer.Result {
		t.Helper()
		select {
		case r := <-results:
			return r
		case <-w.ctx.Done():
			t.Fatal("gave up waiting for the message's result")
			return consumer.Result{}
		}
	}
	m := nats.NewMsg(w.e.subject)
	m.Header.Set(header, "")
	m.Data = []byte("empty id")
	if _, err := w.e.js.PublishMsg(w.ctx, m); err != nil {
		t.Fatal(err)
	}
	w.start(c, w.durable("d", jetstream.ConsumerConfig{}), idemqnats.JetStreamSubscriberConfig{IDHeader: header, Test: record})
	if r := next(); r.Outcome != consumer.DeadLettered || !errors.Is(r.Err, consumer.ErrInvalidMessage) {
		t.Errorf("JetStream message with an empty %s: %v (%v), want DeadLettered with ErrInvalidMessage", header, r.Outcome, r.Err)
	}

	subject := w.e.n.Name("events")
	w.startCore(c, subject, idemqnats.CoreSubscriberConfig{IDHeader: header, Test: record})
	m = nats.NewMsg(subject)
	m.Header.Set(header, "")
	if err := w.e.nc.PublishMsg(m); err != nil {
		t.Fatal(err)
	}
	if r := next(); r.Outcome != consumer.DeadLettered || !errors.Is(r.Err, consumer.ErrInvalidMessage) {
		t.Errorf("core message with an empty %s: %v (%v), want DeadLettered with ErrInvalidMessage", header, r.Outcome, r.Err)
	}
	if got := w.effects(); len(got) != 0 {
		t.Errorf("effects %v, want none", got)
	}
}

// nilJSConsumer and nilJetStream are implementations whose nil pointers a
// careless caller might pass.
type (
	nilJSConsumer struct{ jetstream.Consumer }
	nilJetStream  struct{ jetstream.JetStream }
)
