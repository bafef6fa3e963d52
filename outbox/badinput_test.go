package outbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/outbox"
)

// The bad-input suite of the outbox (issue 23): each careless call gets an
// error that says what to pass, never a panic.

// TestBadInputTypedNilTxIsRefused: a nil pgx.Tx, and a typed nil such as
// (*pgxpool.Tx)(nil) that a plain == nil misses, are refused by every
// call that takes the caller's transaction, instead of panicking.
func TestBadInputTypedNilTxIsRefused(t *testing.T) {
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	var typed *pgxpool.Tx
	for name, tx := range map[string]pgx.Tx{"nil": nil, "typed nil": typed} {
		if err := b.ob.EnqueueTx(ctx, tx, outbox.Message{Destination: "orders", Payload: []byte("{}")}); err == nil {
			t.Errorf("EnqueueTx(%s tx) = nil, want an error", name)
		}
		if _, err := b.ob.ReplayTx(ctx, tx, outbox.DeadFilter{}); err == nil {
			t.Errorf("ReplayTx(%s tx) = nil, want an error", name)
		}
		if _, err := b.ob.PurgeTx(ctx, tx, outbox.DeadFilter{}); err == nil {
			t.Errorf("PurgeTx(%s tx) = nil, want an error", name)
		}
	}
}
