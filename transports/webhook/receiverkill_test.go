package webhook_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/lifecycle"
	"github.com/idemq/idemq/testenv"
	"github.com/idemq/idemq/transports/transporttest"
	"github.com/idemq/idemq/transports/webhook"
	"github.com/idemq/idemq/transports/webhook/signing"
)

// TestReceiverKilledProcesses: a sender posts five webhooks, one after
// the other, to an address served by Receiver processes (this test binary
// re-executed) that are SIGKILLed inside the handler with the transaction
// open (twice) and between the database commit and the answer (twice);
// a survivor in this process then serves the address. Every webhook is
// applied exactly once, none is dead-lettered, and the webhook whose
// answer died with a process comes back as a duplicate.
func TestReceiverKilledProcesses(t *testing.T) {
	url := testenv.PostgresURL(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	transporttest.CreateEffects(t, pool)
	spec := transporttest.ChildSpec{DatabaseURL: url, Params: map[string]string{"addr": freeAddr(t), "secret": signing.NewSecret()}}
	h := newWebhookHarness(t, spec.Params["secret"])
	var ids []string
	for i := range 5 {
		m := transporttest.Message{ID: fmt.Sprint("evt_", i), Payload: fmt.Appendf(nil, `{"n":%d}`, i)}
		ids = append(ids, m.ID)
		if err := h.Publish(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	ctx, stopSending := context.WithCancel(context.Background())
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		h.send(ctx, "g", "http://"+spec.Params["addr"])
	}()
	defer func() { stopSending(); <-sent }()

	transporttest.KillChildren(t, "TestReceiverKilledChild", spec,
		transporttest.KillInHandler, transporttest.KillInHandler, transporttest.KillBeforeAck, transporttest.KillBeforeAck)
	transporttest.Survive(t, pool, spec, ids, func(c *consumer.Consumer) (idemq.Service, error) {
		r, err := webhook.NewReceiver(c, webhook.ReceiverConfig{Keys: []string{h.ring}})
		return &receiverProcess{addr: spec.Params["addr"], recv: r}, err
	})
}

// TestReceiverKilledChild is the Receiver process of
// TestReceiverKilledProcesses; it runs only as its child.
func TestReceiverKilledChild(t *testing.T) {
	spec, ok := transporttest.Child()
	if !ok {
		t.Skip("the child process of TestReceiverKilledProcesses")
	}
	pool, err := pgxpool.New(context.Background(), spec.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg := webhook.ReceiverConfig{Keys: []string{spec.Params["secret"]}}
	cfg.Test.BeforeAnswer = spec.BeforeAck()
	r, err := webhook.NewReceiver(transporttest.ChildConsumer(t, pool, spec, consumer.Hooks{}), cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := &receiverProcess{addr: spec.Params["addr"], recv: r}
	t.Fatalf("the receiver stopped before the kill: %v", p.Run(context.Background()))
}

// freeAddr returns a loopback address nothing listens on now.
func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// receiverProcess serves a Receiver on a fixed address, as a deployed
// process does, until its context ends.
type receiverProcess struct {
	addr  string
	recv  *webhook.Receiver
	state lifecycle.State
}

func (p *receiverProcess) Ready() <-chan struct{} { return p.state.Ready() }

func (p *receiverProcess) Run(ctx context.Context) error {
	ready, end, err := p.state.Begin()
	if err != nil {
		return err
	}
	defer end()
	var ln net.Listener
	for { // the address may still be held by a process just killed
		if ln, err = net.Listen("tcp", p.addr); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(10 * time.Millisecond):
		}
	}
	srv := &http.Server{Handler: p.recv}
	ready()
	stop := context.AfterFunc(ctx, func() { _ = srv.Shutdown(context.Background()) })
	defer stop()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
