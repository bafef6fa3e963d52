package relay_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/testenv"
)

// TestStandbyFailsAtStart gives the relay a real hot standby (a base
// backup of a private primary, following it by streaming replication),
// where the outbox's tables exist but nothing can be written: Run returns
// an idemq.ErrConfig error at once that says it is a standby and how to
// reach the primary, instead of retrying batches that can never write.
func TestStandbyFailsAtStart(t *testing.T) {
	t.Parallel()
	primary := testenv.PrivatePostgres(t)
	ctx := context.Background()
	ppool, err := pgxpool.New(ctx, primary.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ppool.Close)
	setupOn(t, ppool) // the outbox's tables, on the primary
	standby := primary.PrivateStandby(t)
	spool, err := pgxpool.New(ctx, standby.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(spool.Close)
	waitFor(t, "the tables on the standby", func() bool {
		var ok bool
		err := spool.QueryRow(ctx, `SELECT pg_is_in_recovery() AND to_regclass('idemq_outbox_lease') IS NOT NULL`).Scan(&ok)
		return err == nil && ok
	})
	err = startErr(t, bundle{ctx, spool, mustOutbox(t, spool)})
	if !errors.Is(err, idemq.ErrConfig) || !strings.Contains(err.Error(), "standby") || !strings.Contains(err.Error(), "target_session_attrs") {
		t.Fatalf("Run on a standby: %v; want an ErrConfig error at start that says standby and how to reach the primary", err)
	}
	t.Log(err)
}
