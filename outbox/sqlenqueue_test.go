package outbox_test

import (
	"context"
	"errors"
	"log/slog"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
)

// The SQL function the outbox's migrations install: <table>_enqueue in the
// outbox's schema.

// TestSQLEnqueueFromATriggerIsPublishedInOrderWithGo: a trigger on a
// business table enqueues a message per order row; Go enqueues others of
// the same keys between them. The relay publishes them all, each key in
// enqueue order, with the trigger's headers, UUIDv7 ids that the function
// returned, and nothing from a transaction that rolled back.
func TestSQLEnqueueFromATriggerIsPublishedInOrderWithGo(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	ctx := b.ctx
	if _, err := b.pool.Exec(ctx, `
		CREATE TABLE orders (id int PRIMARY KEY, customer text NOT NULL, amount numeric NOT NULL);
		CREATE FUNCTION order_placed() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			PERFORM public.idemq_outbox_enqueue('orders', NEW.customer,
				convert_to(format('sql-%s', NEW.id), 'UTF8'),
				jsonb_build_object('content-type', 'text/plain', 'order-id', NEW.id::text));
			RETURN NEW;
		END $$;
		CREATE TRIGGER order_placed AFTER INSERT ON orders FOR EACH ROW EXECUTE FUNCTION order_placed();`); err != nil {
		t.Fatal(err)
	}
	customers := []string{"c1", "c2", "c3"}
	var want []string // payloads in enqueue order
	for i := range 30 {
		customer := customers[i%len(customers)]
		err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			if i%2 == 0 {
				_, err := tx.Exec(ctx, `INSERT INTO orders VALUES ($1, $2, 10)`, i, customer)
				return err
			}
			return b.ob.EnqueueTx(ctx, tx, outbox.Message{Destination: "orders", Key: customer, Payload: []byte("go-" + strconv.Itoa(i))})
		})
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			want = append(want, "sql-"+strconv.Itoa(i))
		} else {
			want = append(want, "go-"+strconv.Itoa(i))
		}
	}
	// A rolled-back business transaction enqueues nothing.
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES (1000, 'c1', 1)`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var got []relay.Message
	sink := relay.SinkFunc(func(_ context.Context, _ relay.BatchID, batch []relay.Message) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, batch...)
		return nil
	})
	r, err := relay.New(b.pool, b.ob, sink, relay.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	deadline := time.Now().Add(time.Minute)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n >= len(want) {
			break
		}
		if time.Now().After(deadline) {
			stop()
			<-done
			t.Fatalf("the relay published %d of %d messages within a minute", n, len(want))
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	perKey := map[string][]string{}
	for _, m := range got {
		perKey[m.Key] = append(perKey[m.Key], string(m.Payload))
		if m.ID.Version() != 7 {
			t.Errorf("%s: id %s is not a UUIDv7", m.Payload, m.ID)
		}
		if p := string(m.Payload); strings.HasPrefix(p, "sql-") && (m.Headers["content-type"] != "text/plain" || m.Headers["order-id"] != strings.TrimPrefix(p, "sql-")) {
			t.Errorf("%s: headers %v", p, m.Headers)
		}
	}
	for i, c := range customers {
		var wantKey []string
		for j := i; j < len(want); j += len(customers) {
			wantKey = append(wantKey, want[j])
		}
		if !slices.Equal(perKey[c], wantKey) {
			t.Errorf("key %s published %v, want %v", c, perKey[c], wantKey)
		}
	}
	if len(got) != len(want) {
		t.Errorf("published %d messages, want %d", len(got), len(want))
	}
}

// TestSQLEnqueueFromPsqlWakesTheRelay: psql, a client with no idemq code,
// enqueues with the function; the row is what EnqueueTx writes (the id
// returned, the key, the headers, an empty headers object stored as
// none), and the commit notifies the outbox's channel, also for an outbox
// in another schema whose channel name is shortened with a hash.
func TestSQLEnqueueFromPsqlWakesTheRelay(t *testing.T) {
	t.Parallel()
	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Fatal("psql not found: install the Postgres client (apt-get install -y postgresql-client)")
	}
	for _, cfg := range []outbox.Config{
		{},
		{Schema: "billing_service_with_a_rather_long_schema_name", Table: "outbox_of_the_billing_service_with_a_long_name"},
	} {
		b := setup(t, cfg)
		ctx := b.ctx
		channel := b.ob.Config().Channel
		listener, err := pgx.Connect(ctx, b.pool.Config().ConnConfig.ConnString())
		if err != nil {
			t.Fatal(err)
		}
		defer listener.Close(ctx)
		if _, err := listener.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
			t.Fatal(err)
		}
		fn := pgx.Identifier{b.ob.Config().Schema, b.ob.Config().Table + "_enqueue"}.Sanitize()
		out, err := exec.Command(psql, "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", b.pool.Config().ConnConfig.ConnString(),
			"-c", `SELECT `+fn+`('invoices', 'customer-7', '\x7b7d', '{"traceparent": "00-abc-def-01"}'), `+
				fn+`('invoices', '', 'unordered', '{}')`).CombinedOutput()
		if err != nil {
			t.Fatalf("psql: %v: %s", err, out)
		}
		ids := strings.Split(strings.TrimSpace(string(out)), "|")
		if len(ids) != 2 {
			t.Fatalf("psql printed %q, want two ids", out)
		}
		wait, cancel := context.WithTimeout(ctx, time.Minute)
		n, err := listener.WaitForNotification(wait)
		cancel()
		if err != nil {
			t.Fatalf("%s: no notification on %q: %v", fn, channel, err)
		}
		if n.Channel != channel {
			t.Errorf("notified %q, want %q", n.Channel, channel)
		}
		got := rows(t, b)
		if len(got) != 2 {
			t.Fatalf("%d rows, want 2", len(got))
		}
		for i, r := range got {
			if r.ID.String() != ids[i] || r.ID.Version() != 7 {
				t.Errorf("row %d: id %s, psql printed %s; want the same UUIDv7", i, r.ID, ids[i])
			}
		}
		if got[0].Key == nil || *got[0].Key != "customer-7" || string(got[0].Payload) != "{}" || got[0].Headers["traceparent"] != "00-abc-def-01" {
			t.Errorf("first row %+v", got[0])
		}
		if got[1].Key != nil || got[1].Headers != nil || string(got[1].Payload) != "unordered" {
			t.Errorf("second row %+v: want no key and no headers", got[1])
		}
	}
}

// TestSQLEnqueueNotifiesOncePerInterval: a session notifies at most once
// per idemq.notify_interval_ms, as an Outbox does per NotifyInterval: after
// a rollback (whose NOTIFY never went out) the next commit notifies, the
// commit after it within the interval does not, and a negative interval
// notifies every time. A NOTIFY from another session marks the place in
// the sequence, so the test needs no timing.
func TestSQLEnqueueNotifiesOncePerInterval(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	ctx := b.ctx
	connect := func() *pgx.Conn {
		c, err := pgx.Connect(ctx, b.pool.Config().ConnConfig.ConnString())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(ctx) })
		return c
	}
	listener, session, other := connect(), connect(), connect()
	channel := b.ob.Config().Channel
	if _, err := listener.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	enqueue := func(commit bool) {
		t.Helper()
		tx, err := session.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `SELECT public.idemq_outbox_enqueue('d', 'k', 'x')`); err != nil {
			t.Fatal(err)
		}
		if commit {
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	mark := func() {
		t.Helper()
		if _, err := other.Exec(ctx, `SELECT pg_notify($1, 'mark')`, channel); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := session.Exec(ctx, `SET idemq.notify_interval_ms = 3600000`); err != nil {
		t.Fatal(err)
	}
	enqueue(false)
	enqueue(true) // notifies: the rollback's NOTIFY did not count
	enqueue(true) // within the hour: no NOTIFY
	mark()
	if _, err := session.Exec(ctx, `SET idemq.notify_interval_ms = -1`); err != nil {
		t.Fatal(err)
	}
	enqueue(true) // notifies
	var got []string
	for range 3 {
		wait, cancel := context.WithTimeout(ctx, time.Minute)
		n, err := listener.WaitForNotification(wait)
		cancel()
		if err != nil {
			t.Fatalf("after %q: %v", got, err)
		}
		got = append(got, n.Payload)
	}
	if want := []string{"", "mark", ""}; !slices.Equal(got, want) {
		t.Fatalf("notifications %q, want %q", got, want)
	}
}

// TestBadInputSQLEnqueue: every argument EnqueueTx would refuse is an
// error with a SQLSTATE and a message naming the argument, and nothing is
// written; an unknown schema is Postgres' own error.
func TestBadInputSQLEnqueue(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	long := strings.Repeat("k", outbox.MaxKeyLen+1)
	for _, c := range []struct {
		name, set, sql string
		code, says     string
	}{
		{"NULL destination", "", `SELECT public.idemq_outbox_enqueue(NULL, 'k', 'x')`, "22004", "destination is NULL"},
		{"NULL payload", "", `SELECT public.idemq_outbox_enqueue('d', 'k', NULL)`, "22004", "payload is NULL"},
		{"empty destination", "", `SELECT public.idemq_outbox_enqueue('', 'k', 'x')`, "22023", "destination: 0 bytes"},
		{"long destination", "", `SELECT public.idemq_outbox_enqueue('` + long + `', 'k', 'x')`, "22023", "destination: 1025 bytes"},
		{"long key", "", `SELECT public.idemq_outbox_enqueue('d', '` + long + `', 'x')`, "22023", "key: 1025 bytes"},
		{"payload over the default limit", "", `SELECT public.idemq_outbox_enqueue('d', 'k', convert_to(repeat('x', 1048577), 'UTF8'))`, "54000", "payload: 1048577 bytes, limit 1048576"},
		{"payload over idemq.max_payload", `SET LOCAL idemq.max_payload = 10`, `SELECT public.idemq_outbox_enqueue('d', 'k', '12345678901')`, "54000", "payload: 11 bytes, limit 10"},
		{"headers an array", "", `SELECT public.idemq_outbox_enqueue('d', 'k', 'x', '["a"]')`, "22023", "a JSON array"},
		{"header name not a token", "", `SELECT public.idemq_outbox_enqueue('d', 'k', 'x', '{"no spaces": "v"}')`, "22023", "headers: no spaces"},
		{"header value a number", "", `SELECT public.idemq_outbox_enqueue('d', 'k', 'x', '{"n": 1}')`, "22023", "headers: n"},
		{"header value with a newline", "", `SELECT public.idemq_outbox_enqueue('d', 'k', 'x', '{"v": "a\nb"}')`, "22023", "headers: v"},
		{"headers over 64 KiB", "", `SELECT public.idemq_outbox_enqueue('d', 'k', 'x', jsonb_build_object('h', repeat('v', 65536)))`, "54000", "headers: "},
		{"unknown schema", "", `SELECT nosuch.idemq_outbox_enqueue('d', 'k', 'x')`, "3F000", `schema "nosuch" does not exist`},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
				if c.set != "" {
					if _, err := tx.Exec(b.ctx, c.set); err != nil {
						return err
					}
				}
				_, err := tx.Exec(b.ctx, c.sql)
				return err
			})
			pgErr, ok := errors.AsType[*pgconn.PgError](err)
			if !ok || pgErr.Code != c.code || !strings.Contains(pgErr.Message, c.says) {
				t.Fatalf("error %v, want SQLSTATE %s saying %q", err, c.code, c.says)
			}
		})
	}
	if got := rows(t, b); len(got) != 0 {
		t.Fatalf("%d rows written, want none", len(got))
	}
}
