package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/transports/webhook"
	"github.com/idemq/idemq/transports/webhook/endpoints"
)

// relayChildEnv holds, in a child process started by killRelay, the JSON
// relaySpec of the relay it runs.
const relayChildEnv = "IDEMQ_DEMO_RELAY_CHILD"

// relaySpec is what a relay process needs: the database and, per leg, how
// to reach its broker.
type relaySpec struct {
	DatabaseURL string
	Sinks       []sinkSpec
}

// newRelay returns the demo's relay on pool, routing every leg's
// destination to its sink and the webhook destinations to a webhook Sink
// on reg.
func newRelay(pool *pgxpool.Pool, ob *outbox.Outbox, reg *endpoints.Registry, sinks map[string]relay.Sink) (*relay.Relay, error) {
	router := relay.NewRouter()
	for dest, s := range sinks {
		if err := router.Route(dest, s); err != nil {
			return nil, err
		}
	}
	ws, err := webhook.NewSink(reg, webhookSinkConfig())
	if err != nil {
		return nil, err
	}
	if err := router.RoutePrefix(endpoints.DestinationPrefix, ws); err != nil {
		return nil, err
	}
	return relay.New(pool, ob, router, relay.Config{BatchSize: relayBatch, PollInterval: 50 * time.Millisecond,
		Retry: idemq.Retry{MaxAttempts: 50, BaseDelay: 10 * time.Millisecond, MaxDelay: 200 * time.Millisecond}})
}

// killRelay runs a relay in a child process (this program, re-executed)
// and SIGKILLs it as soon as it announces that a batch reached the brokers:
// its transaction, which would have deleted the batch from the outbox,
// dies with it, so the next relay publishes that batch again. It returns
// how many messages the child published.
func killRelay(ctx context.Context, spec relaySpec) (int, error) {
	self, err := os.Executable()
	if err != nil {
		return 0, err
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return 0, err
	}
	cmd := exec.CommandContext(ctx, self)
	cmd.Env = append(os.Environ(), relayChildEnv+"="+string(b))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	var published int
	_, scanErr := fmt.Fscanf(bufio.NewReader(out), "published %d\n", &published)
	killErr := cmd.Process.Kill()
	_ = cmd.Wait() // killed: the error says so
	if scanErr != nil {
		return 0, fmt.Errorf("relay child never published: %w", errors.Join(scanErr, killErr))
	}
	return published, killErr
}

// relayChild is the child process of killRelay: a relay whose sinks, once
// one Publish has succeeded, announce it and block until the process is
// killed, between the publish and the commit that deletes the batch.
func relayChild(encoded string) error {
	var spec relaySpec
	if err := json.Unmarshal([]byte(encoded), &spec); err != nil {
		return err
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, spec.DatabaseURL)
	if err != nil {
		return err
	}
	ob, err := outbox.New(pool, outbox.Config{Schema: schema})
	if err != nil {
		return err
	}
	reg, err := endpoints.NewRegistry(pool, endpoints.RegistryConfig{Schema: schema})
	if err != nil {
		return err
	}
	var once sync.Once
	sinks := make(map[string]relay.Sink, len(spec.Sinks))
	for _, s := range spec.Sinks {
		sink, _, err := openSink(ctx, s)
		if err != nil {
			return err
		}
		sinks[s.Destination] = relay.SinkFunc(func(ctx context.Context, id relay.BatchID, msgs []relay.Message) error {
			if err := sink.Publish(ctx, id, msgs); err != nil {
				return err
			}
			once.Do(func() { fmt.Printf("published %d\n", len(msgs)) })
			select {} // killed here
		})
	}
	r, err := newRelay(pool, ob, reg, sinks)
	if err != nil {
		return err
	}
	return r.Run(ctx)
}
