package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/request/pgstore"
	"github.com/idemq/idemq/testenv"
)

// The bad-input suite of the Postgres request store (issue 23): each
// careless call gets an idemq.ErrConfig that names what to change, never a
// panic, and never a silent change of meaning.

// TestBadInputConfig: a nil or typed-nil db, bad table and schema names and
// a RecordTTL under a second are refused with an idemq.ErrConfig of this
// store naming the field (not of the inbox it is built on).
func TestBadInputConfig(t *testing.T) {
	pool := testenv.Postgres(t)
	var typed *pgxpool.Pool
	for name, db := range map[string]*pgxpool.Pool{"nil": nil, "typed nil": typed} {
		if _, err := pgstore.New(db, pgstore.Config{}); !isConfigError(err, "db") {
			t.Errorf("New(%s db) = %v, want an idemq.ErrConfig naming db", name, err)
		}
	}
	for _, tc := range []struct {
		field string
		cfg   pgstore.Config
	}{
		{"Table", pgstore.Config{Table: "bad name"}},
		{"Table", pgstore.Config{Table: "Requests"}},
		{"Table", pgstore.Config{Table: "requests; DROP TABLE x"}},
		{"Schema", pgstore.Config{Schema: "1st"}},
		{"Schema", pgstore.Config{Schema: "a.b"}},
		{"RecordTTL", pgstore.Config{RecordTTL: time.Nanosecond}},
		{"RecordTTL", pgstore.Config{RecordTTL: -time.Hour}},
	} {
		if _, err := pgstore.New(pool, tc.cfg); !isConfigError(err, tc.field) {
			t.Errorf("New(%+v) = %v, want a pgstore idemq.ErrConfig naming %s", tc.cfg, err, tc.field)
		}
	}
}

// TestBadInputCompleteTxWithoutATransaction: CompleteTx with a nil or
// typed-nil tx completed the record in a transaction of its own, stored
// whether or not the caller's work committed. It is refused, and the
// record stays held for the right transaction.
func TestBadInputCompleteTxWithoutATransaction(t *testing.T) {
	pool := testenv.Postgres(t)
	s := newStore(t, pool, 0)
	ctx := context.Background()
	id := request.ID{Scope: "POST /orders", Key: "k-1"}
	c, err := s.Claim(ctx, id, []byte("fp"), time.Minute)
	if err != nil || !c.Acquired {
		t.Fatalf("Claim: %+v, %v", c, err)
	}
	resp := request.Response{Status: 201, Body: []byte(`{"id":1}`)}
	for name, tx := range map[string]pgx.Tx{"nil": nil, "typed nil": (*pgxpool.Tx)(nil)} {
		if err := s.CompleteTx(ctx, tx, c.Lease, resp); !isConfigError(err, "tx") {
			t.Errorf("CompleteTx(%s tx) = %v, want an idemq.ErrConfig naming tx", name, err)
		}
	}
	if rec, err := s.Get(ctx, id); err != nil || rec.State != request.InProgress {
		t.Fatalf("record after refused CompleteTx calls: %+v, %v; want it still in flight", rec, err)
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return s.CompleteTx(ctx, tx, c.Lease, resp) }); err != nil {
		t.Fatalf("CompleteTx in a transaction: %v", err)
	}
	if rec, err := s.Get(ctx, id); err != nil || rec.State != request.Completed || rec.Response == nil || string(rec.Response.Body) != `{"id":1}` {
		t.Fatalf("record after CompleteTx: %+v, %v; want it completed with the response", rec, err)
	}
}

func isConfigError(err error, field string) bool {
	ce, ok := errors.AsType[*idemq.ConfigError](err)
	return ok && errors.Is(err, idemq.ErrConfig) && ce.Field == field && ce.Component == "pgstore"
}
