package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/testenv"
)

type bundle struct {
	ctx  context.Context
	pool *pgxpool.Pool
	ob   *outbox.Outbox
}

func setup(t *testing.T, cfg outbox.Config) bundle {
	t.Helper()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	ob, err := outbox.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return bundle{ctx: ctx, pool: pool, ob: ob}
}

type row struct {
	Seq         int64
	ID          uuid.UUID
	Destination string
	Key         *string
	Payload     []byte
	Headers     map[string]string
	Attempts    int
}

func rows(t *testing.T, b bundle) []row {
	t.Helper()
	r, err := b.pool.Query(b.ctx, `SELECT seq, id, destination, key, payload, headers, attempts FROM `+b.table()+` ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(r, pgx.RowToStructByPos[row])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	for _, cfg := range []outbox.Config{
		{Table: "Bad-Name"},
		{Schema: "1x"},
		{Table: strings.Repeat("t", 49)},
		{MaxPayload: -1},
		{Channel: strings.Repeat("c", 64)},
	} {
		if _, err := outbox.New(pool, cfg); err == nil {
			t.Errorf("New(%+v) accepted an invalid config", cfg)
		}
	}
	if _, err := outbox.New(nil, outbox.Config{}); !errors.Is(err, idemq.ErrConfig) {
		t.Errorf("New(nil db): %v, want ErrConfig", err)
	}
}

func TestMigrateIsIdempotentAndConcurrent(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{Schema: "app", Table: "events_outbox"})
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- b.ob.Migrate(b.ctx)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if b.table() != `"app"."events_outbox"` || b.deadTable() != `"app"."events_outbox_dead"` {
		t.Fatalf("tables %s %s", b.table(), b.deadTable())
	}
	if b.ob.Config().Channel != "app.events_outbox" {
		t.Fatalf("channel %q", b.ob.Config().Channel)
	}
}

func TestEnqueueCommitAndRollback(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	myID := uuid.Must(uuid.NewV7())
	err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		return b.ob.EnqueueTx(b.ctx, tx,
			outbox.Message{Destination: "orders", Key: "o-1", Payload: []byte("a"), Headers: map[string]string{"traceparent": "00-abc-def-01"}},
			outbox.Message{ID: myID, Destination: "orders", Payload: nil},
		)
	})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.ob.EnqueueTx(b.ctx, tx, outbox.Message{Destination: "orders", Payload: []byte("rolled back")}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	got := rows(t, b)
	if len(got) != 2 {
		t.Fatalf("%d rows, want 2: %+v", len(got), got)
	}
	if got[0].ID.Version() != 7 || got[0].Key == nil || *got[0].Key != "o-1" || string(got[0].Payload) != "a" ||
		got[0].Headers["traceparent"] != "00-abc-def-01" || got[0].Attempts != 0 {
		t.Errorf("first row %+v", got[0])
	}
	if got[1].ID != myID || got[1].Key != nil || got[1].Payload == nil || len(got[1].Payload) != 0 || got[1].Headers != nil {
		t.Errorf("second row %+v", got[1])
	}
}

func TestEnqueueLargeBatchUsesCopyAndKeepsOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	for _, n := range []int{10, 1000} {
		msgs := make([]outbox.Message, n)
		for i := range msgs {
			msgs[i] = outbox.Message{Destination: "d", Key: fmt.Sprint("k", i%7), Payload: fmt.Appendf(nil, "%d-%d", n, i)}
			if i%3 == 0 {
				msgs[i].Headers = map[string]string{"n": fmt.Sprint(i)}
			}
		}
		if err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error { return b.ob.EnqueueTx(b.ctx, tx, msgs...) }); err != nil {
			t.Fatal(err)
		}
	}
	got := rows(t, b)
	if len(got) != 1010 {
		t.Fatalf("%d rows", len(got))
	}
	for i, r := range got[10:] {
		if string(r.Payload) != fmt.Sprintf("1000-%d", i) || *r.Key != fmt.Sprint("k", i%7) {
			t.Fatalf("row %d out of order: %s", i, r.Payload)
		}
		if (i%3 == 0) != (r.Headers != nil) || (r.Headers != nil && r.Headers["n"] != fmt.Sprint(i)) {
			t.Fatalf("row %d headers %v", i, r.Headers)
		}
	}
}

func TestEnqueueRejectsBadInputAndLeavesTxUsable(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{MaxPayload: 10})
	ok := outbox.Message{Destination: "d", Payload: []byte("ok")}
	cases := []struct {
		name  string
		msg   outbox.Message
		field string
		is    error
	}{
		{"empty destination", outbox.Message{Payload: []byte("x")}, "destination", nil},
		{"long destination", outbox.Message{Destination: strings.Repeat("d", outbox.MaxDestinationLen+1)}, "destination", nil},
		{"NUL in destination", outbox.Message{Destination: "a\x00b"}, "destination", nil},
		{"payload over limit", outbox.Message{Destination: "d", Payload: make([]byte, 11)}, "payload", outbox.ErrPayloadTooLarge},
		{"long key", outbox.Message{Destination: "d", Key: strings.Repeat("k", outbox.MaxKeyLen+1)}, "key", nil},
		{"invalid UTF-8 key", outbox.Message{Destination: "d", Key: "\xff"}, "key", nil},
		{"header name with space", outbox.Message{Destination: "d", Headers: map[string]string{"bad name": "v"}}, "headers", nil},
		{"empty header name", outbox.Message{Destination: "d", Headers: map[string]string{"": "v"}}, "headers", nil},
		{"header value with newline", outbox.Message{Destination: "d", Headers: map[string]string{"x": "a\r\nb"}}, "headers", nil},
		{"header value with NUL", outbox.Message{Destination: "d", Headers: map[string]string{"x": "a\x00"}}, "headers", nil},
	}
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx)
	for _, c := range cases {
		err := b.ob.EnqueueTx(b.ctx, tx, ok, c.msg)
		var ime *outbox.InvalidMessageError
		if !errors.Is(err, outbox.ErrInvalidMessage) || !errors.As(err, &ime) || ime.Index != 1 || ime.Field != c.field {
			t.Errorf("%s: err = %v, want an InvalidMessageError for message 1, field %s", c.name, err, c.field)
		}
		if c.is != nil && !errors.Is(err, c.is) {
			t.Errorf("%s: err = %v, want it to match %v", c.name, err, c.is)
		}
	}
	// The transaction was never touched: it still works and commits.
	if err := b.ob.EnqueueTx(b.ctx, tx, ok); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if got := rows(t, b); len(got) != 1 || string(got[0].Payload) != "ok" {
		t.Fatalf("rows %+v, want only the one valid message", got)
	}
}

func TestEnqueueNotifiesOncePerTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	conn, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(b.ctx, `LISTEN `+pgx.Identifier{b.ob.Config().Channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		for range 3 {
			if err := b.ob.EnqueueTx(b.ctx, tx, outbox.Message{Destination: "d"}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	n, err := conn.Conn().WaitForNotification(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n.Channel != b.ob.Config().Channel {
		t.Fatalf("notification on %q", n.Channel)
	}
	// No second notification for the same transaction.
	short, cancel2 := context.WithTimeout(b.ctx, 200*time.Millisecond)
	defer cancel2()
	if n, err := conn.Conn().WaitForNotification(short); err == nil {
		t.Fatalf("second notification %+v", n)
	}
}

func TestDisableNotify(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{DisableNotify: true})
	conn, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(b.ctx, `LISTEN `+pgx.Identifier{b.ob.Config().Channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error { return b.ob.EnqueueTx(b.ctx, tx, outbox.Message{Destination: "d"}) }); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(b.ctx, 200*time.Millisecond)
	defer cancel()
	if n, err := conn.Conn().WaitForNotification(short); err == nil {
		t.Fatalf("notification %+v with DisableNotify", n)
	}
}

// kill moves outbox rows to the dead letters the way the relay does.
func kill(t *testing.T, b bundle, cause string, payloads ...string) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `WITH d AS (DELETE FROM `+b.table()+` WHERE convert_from(payload, 'UTF8') = ANY($1) RETURNING *)
INSERT INTO `+b.deadTable()+` (seq, id, created_at, attempts, destination, payload, key, headers, last_error)
SELECT seq, id, created_at, 3, destination, payload, key, headers, $2 FROM d`, payloads, cause)
	if err != nil {
		t.Fatal(err)
	}
}

func TestDeadLettersListReplayPurge(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		return b.ob.EnqueueTx(b.ctx, tx,
			outbox.Message{Destination: "orders.created", Key: "k1", Payload: []byte("a")},
			outbox.Message{Destination: "orders.paid", Key: "k1", Payload: []byte("b")},
			outbox.Message{Destination: "billing", Payload: []byte("c")},
			outbox.Message{Destination: "orders.created", Key: "k2", Payload: []byte("d")},
		)
	})
	if err != nil {
		t.Fatal(err)
	}
	kill(t, b, "boom", "a", "c", "d")
	// Park b behind its dead head the way the relay's ParkFollowers does.
	if _, err := b.pool.Exec(b.ctx, `UPDATE `+b.table()+` SET available_at = 'infinity'`); err != nil {
		t.Fatal(err)
	}
	payloads := func(ds []outbox.DeadLetter) string {
		var s []string
		for _, d := range ds {
			s = append(s, string(d.Payload))
		}
		return strings.Join(s, ",")
	}
	all, err := b.ob.DeadLetters(b.ctx, outbox.DeadFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if payloads(all) != "a,c,d" || all[0].LastError != "boom" || all[0].Attempts != 3 || all[0].Key != "k1" || all[0].Destination != "orders.created" {
		t.Fatalf("dead letters %+v", all)
	}
	for _, c := range []struct {
		f    outbox.DeadFilter
		want string
	}{
		{outbox.DeadFilter{Destination: "billing"}, "c"},
		{outbox.DeadFilter{DestinationPrefix: "orders."}, "a,d"},
		{outbox.DeadFilter{Key: "k2"}, "d"},
		{outbox.DeadFilter{IDs: []uuid.UUID{all[2].ID}}, "d"},
		{outbox.DeadFilter{FailedBefore: time.Now().Add(time.Hour)}, "a,c,d"},
		{outbox.DeadFilter{FailedBefore: all[0].FailedAt.Add(-time.Hour)}, ""},
		{outbox.DeadFilter{FailedAfter: all[0].FailedAt.Add(-time.Hour)}, "a,c,d"},
		{outbox.DeadFilter{Limit: 1}, "a"},
	} {
		got, err := b.ob.DeadLetters(b.ctx, c.f)
		if err != nil {
			t.Fatal(err)
		}
		if payloads(got) != c.want {
			t.Errorf("filter %+v: %q, want %q", c.f, payloads(got), c.want)
		}
	}

	n, err := b.ob.Replay(b.ctx, outbox.DeadFilter{Key: "k1"})
	if err != nil || n != 1 {
		t.Fatalf("replay: %d, %v", n, err)
	}
	pending := rows(t, b)
	if len(pending) != 2 || string(pending[0].Payload) != "a" || string(pending[1].Payload) != "b" || pending[0].Attempts != 0 || pending[0].ID != all[0].ID {
		t.Fatalf("after replay %+v", pending)
	}
	var parked int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM `+b.table()+` WHERE available_at = 'infinity'`).Scan(&parked); err != nil || parked != 0 {
		t.Fatalf("%d rows still parked (%v)", parked, err)
	}
	n, err = b.ob.Purge(b.ctx, outbox.DeadFilter{Destination: "billing"})
	if err != nil || n != 1 {
		t.Fatalf("purge: %d, %v", n, err)
	}
	left, err := b.ob.DeadLetters(b.ctx, outbox.DeadFilter{})
	if err != nil || payloads(left) != "d" {
		t.Fatalf("left %q %v", payloads(left), err)
	}
	st, err := b.ob.Stats(b.ctx)
	if err != nil || st.Pending != 2 || st.Dead != 1 || st.OldestPending <= 0 {
		t.Fatalf("stats %+v %v", st, err)
	}
}

// TestNilTxIsAnError: the Tx calls refuse a nil tx with an error instead of
// panicking, and write nothing.
func TestNilTxIsAnError(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	if err := b.ob.EnqueueTx(b.ctx, nil, outbox.Message{Destination: "d"}); err == nil {
		t.Error("EnqueueTx(nil tx) returned nil")
	}
	if _, err := b.ob.ReplayTx(b.ctx, nil, outbox.DeadFilter{}); err == nil {
		t.Error("ReplayTx(nil tx) returned nil")
	}
	if _, err := b.ob.PurgeTx(b.ctx, nil, outbox.DeadFilter{}); err == nil {
		t.Error("PurgeTx(nil tx) returned nil")
	}
	if n := len(rows(t, b)); n != 0 {
		t.Fatalf("%d rows written", n)
	}
}

// TestEnqueueOnTheHandle: Enqueue commits its own transaction.
func TestEnqueueOnTheHandle(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	if err := b.ob.Enqueue(b.ctx, outbox.Message{Destination: "d", Key: "k", Payload: []byte("1")}, outbox.Message{Destination: "d", Key: "k", Payload: []byte("2")}); err != nil {
		t.Fatal(err)
	}
	got := rows(t, b)
	if len(got) != 2 || string(got[0].Payload) != "1" || string(got[1].Payload) != "2" {
		t.Fatalf("rows %+v", got)
	}
	err := b.ob.Enqueue(b.ctx, outbox.Message{Destination: "d", Payload: make([]byte, outbox.MaxPayloadDefault+1)})
	if !errors.Is(err, outbox.ErrPayloadTooLarge) || !strings.HasPrefix(outbox.ErrPayloadTooLarge.Error(), "outbox: ") {
		t.Fatalf("oversized payload: %v", err)
	}
	if n := len(rows(t, b)); n != 2 {
		t.Fatalf("%d rows after a refused Enqueue, want 2", n)
	}
}

// table and deadTable are the quoted tables.
func (b bundle) table() string {
	c := b.ob.Config()
	return pgx.Identifier{c.Schema, c.Table}.Sanitize()
}

func (b bundle) deadTable() string {
	c := b.ob.Config()
	return pgx.Identifier{c.Schema, c.Table + "_dead"}.Sanitize()
}

// TestDefaultChannelFitsNotify: a default channel longer than Postgres' 63
// bytes is shortened the same way every time, stays distinct, and works.
func TestDefaultChannelFitsNotify(t *testing.T) {
	t.Parallel()
	schema, table := strings.Repeat("s", 40), strings.Repeat("t", 40)
	b := setup(t, outbox.Config{Schema: schema, Table: table})
	ch := b.ob.Config().Channel
	other, err := outbox.New(b.pool, outbox.Config{Schema: schema, Table: table[:39] + "u"})
	if err != nil {
		t.Fatal(err)
	}
	again, err := outbox.New(b.pool, outbox.Config{Schema: schema, Table: table})
	if err != nil {
		t.Fatal(err)
	}
	if len(ch) != 63 || again.Config().Channel != ch || other.Config().Channel == ch || !strings.HasPrefix(ch, schema+".") {
		t.Fatalf("channel %q (%d bytes), again %q, other %q", ch, len(ch), again.Config().Channel, other.Config().Channel)
	}
	conn, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(b.ctx, `LISTEN `+pgx.Identifier{ch}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	if err := b.ob.Enqueue(b.ctx, outbox.Message{Destination: "d"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if n, err := conn.Conn().WaitForNotification(ctx); err != nil || n.Channel != ch {
		t.Fatalf("notification %+v, %v", n, err)
	}
}

// TestRetryNow: the waiting rows of one destination become due and the
// relays are woken; parked rows, locked rows and other destinations keep
// their time, and no row loses its attempts.
func TestRetryNow(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	var msgs []outbox.Message
	for i := range 5 {
		msgs = append(msgs, outbox.Message{Destination: "hook/a", Key: "k", Payload: fmt.Appendf(nil, "%d", i)})
	}
	msgs = append(msgs, outbox.Message{Destination: "hook/b", Payload: []byte("b")})
	if err := b.ob.Enqueue(b.ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	// Rows 1-4 of hook/a wait an hour with 3 attempts (retried), row 5 is
	// parked behind a dead letter, and hook/b waits too.
	if _, err := b.pool.Exec(b.ctx, `UPDATE `+b.table()+` SET attempts = 3,
		available_at = CASE WHEN payload = '4' THEN 'infinity' ELSE now() + interval '1 hour' END`); err != nil {
		t.Fatal(err)
	}
	// A relay has row 1 in flight.
	inFlight, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer inFlight.Rollback(b.ctx) //nolint:errcheck
	if _, err := inFlight.Exec(b.ctx, `SELECT 1 FROM `+b.table()+` WHERE payload = '0' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	conn, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(b.ctx, `LISTEN `+pgx.Identifier{b.ob.Config().Channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}

	n, err := b.ob.RetryNow(b.ctx, "hook/a")
	if err != nil || n != 3 {
		t.Fatalf("RetryNow = %d, %v; want the 3 waiting, unlocked, unparked rows", n, err)
	}
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	if _, err := conn.Conn().WaitForNotification(ctx); err != nil {
		t.Fatalf("no NOTIFY after RetryNow: %v", err)
	}
	r, err := b.pool.Query(b.ctx, `SELECT destination || ':' || convert_from(payload, 'UTF8') FROM `+b.table()+`
		WHERE available_at <= now() AND attempts = 3 ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	due, err := pgx.CollectRows(r, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"hook/a:1", "hook/a:2", "hook/a:3"}; fmt.Sprint(due) != fmt.Sprint(want) {
		t.Fatalf("due rows %v, want %v", due, want)
	}
}
