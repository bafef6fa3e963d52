package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/testenv"
)

// The relay runs behind PgBouncer in transaction mode: migrations, claims
// and stats go through it, LISTEN goes to --listen-url. With a poll
// interval of an hour, only a NOTIFY (sent through the pooler at commit)
// can wake it, and it publishes every message. A message whose
// destination no route matches is held, logged (in text format) and
// counted by idemq stats, not dead-lettered.
func TestRelayBehindPgBouncer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	direct := testenv.PostgresURL(t)
	pooled := testenv.PgBouncer(t, direct)
	mustRun(t, pooled, "migrate")
	pool, err := pgxpool.New(ctx, pooled)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ob, err := outbox.New(pool, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ns := testenv.NATS(t)
	js, err := jetstream.New(ns.ConnectTB(t))
	if err != nil {
		t.Fatal(err)
	}
	subject := ns.Name("pooled")
	stream, err := ns.CreateStream(ctx, js, jetstream.StreamConfig{Name: ns.Name("POOLED"), Subjects: []string{subject + ".>"}})
	if err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	p := startEnv(t, env("DATABASE_URL="+pooled, "IDEMQ_NATS_URL="+ns.URL),
		"relay", "--route", subject+".*=jetstream", "--listen-url", direct, "--poll-interval", "1h", "--lease-ttl", "1h",
		"--log-format", "text", "--stats-interval", "100ms", "--http-addr", addr)
	idemqtest.WaitForNoError(t, "readyz", func() error {
		code, body, err := get("http://" + addr + "/readyz")
		if err == nil && code != 200 {
			err = fmt.Errorf("readyz %d: %s", code, body)
		}
		return err
	})
	// A woken relay polls briefly (outbox NotifyInterval): let the wake-up
	// of its listener pass, so that only a NOTIFY can wake it again.
	time.Sleep(time.Second)
	ids := enqueue(t, ob, subject+".created", 50, 5)
	if err := ob.Enqueue(ctx, outbox.Message{Destination: "nowhere", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	idemqtest.WaitForNoError(t, "every routed message published", func() error {
		info, err := stream.Info(ctx)
		if err == nil && info.State.Msgs != uint64(len(ids)) {
			err = fmt.Errorf("stream holds %d messages", info.State.Msgs)
		}
		return err
	})
	var st statsReport
	idemqtest.WaitForNoError(t, "the unrouted message counted", func() error {
		r := runIdemq(t, pooled, "--json", "stats")
		if r.code != 0 {
			return fmt.Errorf("stats: exit %d: %s", r.code, r.stderr)
		}
		if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
			return err
		}
		if st.OutboxUnrouted != 1 || st.OutboxPending != 1 || st.OutboxDead != 0 {
			return fmt.Errorf("stats %+v", st)
		}
		return nil
	})
	for _, want := range []string{`level=INFO msg="relay: partitions acquired"`, `level=WARN msg="relay: holding the messages of a destination`} {
		idemqtest.WaitForNoError(t, want, func() error {
			if !strings.Contains(p.stderr.String(), want) {
				return fmt.Errorf("not logged yet")
			}
			return nil
		})
	}
}
