package outbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/testenv"
)

// The bad-input suite of the outbox (issue 23): each careless call gets an
// error that says what to pass, never a panic.

// TestBadInputTypedNilTxIsRefused: a nil pgx.Tx, and a typed nil such as
// (*pgxpool.Tx)(nil) that a plain == nil misses, are refused by every
// call that takes the caller's transaction, instead of panicking.
func TestBadInputTypedNilTxIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	var typed *pgxpool.Tx
	for name, tx := range map[string]pgx.Tx{"nil": nil, "typed nil": typed} {
		if err := b.ob.EnqueueTx(ctx, tx, outbox.Message{Destination: "orders", Payload: []byte("{}")}); !errors.Is(err, idemq.ErrConfig) {
			t.Errorf("EnqueueTx(%s tx) = %v, want an idemq.ErrConfig", name, err)
		}
		if _, err := b.ob.ReplayTx(ctx, tx, outbox.DeadFilter{}); !errors.Is(err, idemq.ErrConfig) {
			t.Errorf("ReplayTx(%s tx) = %v, want an idemq.ErrConfig", name, err)
		}
		if _, err := b.ob.PurgeTx(ctx, tx, outbox.DeadFilter{}); !errors.Is(err, idemq.ErrConfig) {
			t.Errorf("PurgeTx(%s tx) = %v, want an idemq.ErrConfig", name, err)
		}
	}
}

// TestBadInputTypedNilDBIsRefused: New refuses a nil DB and a typed nil
// such as (*pgxpool.Pool)(nil), which a plain == nil misses, with an
// idemq.ErrConfig naming db, instead of panicking on the first query.
func TestBadInputTypedNilDBIsRefused(t *testing.T) {
	t.Parallel()
	var (
		pool *pgxpool.Pool
		conn *pgx.Conn
		tx   *pgxpool.Tx
	)
	for name, db := range map[string]outbox.DB{"nil": nil, "typed-nil *pgxpool.Pool": pool, "typed-nil *pgx.Conn": conn, "typed-nil *pgxpool.Tx": tx} {
		ob, err := outbox.New(db, outbox.Config{})
		if ce, ok := errors.AsType[*idemq.ConfigError](err); !ok || ce.Field != "db" || !errors.Is(err, idemq.ErrConfig) || ob != nil {
			t.Errorf("New(%s) = %v, %v; want an idemq.ErrConfig naming db", name, ob, err)
		}
	}
}

// TestBadInputMaxPayloadAboveTheMaximumIsRefused: a MaxPayload above what
// Postgres stores in a value or a relay can hand a broker is refused,
// naming the field; the maximum itself is accepted.
func TestBadInputMaxPayloadAboveTheMaximumIsRefused(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	for _, n := range []int{outbox.MaxPayloadMax + 1, 1 << 31} {
		_, err := outbox.New(pool, outbox.Config{MaxPayload: n})
		if ce, ok := errors.AsType[*idemq.ConfigError](err); !ok || ce.Field != "MaxPayload" {
			t.Errorf("New(MaxPayload: %d) = %v, want a ConfigError for MaxPayload", n, err)
		}
	}
	if _, err := outbox.New(pool, outbox.Config{MaxPayload: outbox.MaxPayloadMax}); err != nil {
		t.Errorf("New(MaxPayload: MaxPayloadMax) = %v", err)
	}
}
