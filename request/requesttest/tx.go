package requesttest

import (
	"errors"
	"testing"
	"time"

	"github.com/idemq/idemq/request"
)

// txTests are the suite's tests of a request.TxStore (the
// transaction-owning mode), run on the stores that are one.
var txTests = []struct {
	name string
	fn   func(t *testing.T, h Harness)
}{
	{"TxCommitReplays", testTxCommitReplays},
	{"TxRollbackLeavesNothing", testTxRollback},
	{"TxDuplicateWaitsForCommit", testTxWaitsForCommit},
	{"TxDuplicateWaitsForRollback", testTxWaitsForRollback},
	{"TxDuplicateWaitIsBounded", testTxWaitBounded},
	{"TxConflict", testTxConflict},
	{"TxAfterLeasedAttempt", testTxAfterLeased},
}

func txStore(t *testing.T, h Harness) request.TxStore { return store(t, h).(request.TxStore) }

// mustBeginTx claims id in a transaction, or fails t.
func mustBeginTx(t *testing.T, s request.TxStore, id request.ID, fp []byte) request.Tx {
	t.Helper()
	c, err := s.BeginTx(ctx(t), id, fp, time.Second)
	if err != nil || c.Tx == nil {
		t.Fatalf("BeginTx %v = %+v, %v; want the key claimed", id, c, err)
	}
	return c.Tx
}

// beginTxAsync is BeginTx in another goroutine, for a duplicate that
// waits on the holder's transaction.
func beginTxAsync(t *testing.T, s request.TxStore, id request.ID, wait time.Duration) <-chan txBegun {
	done := make(chan txBegun, 1)
	go func() {
		c, err := s.BeginTx(ctx(t), id, fpA, wait)
		done <- txBegun{c, err}
	}()
	return done
}

type txBegun struct {
	c   request.TxClaim
	err error
}

func testTxCommitReplays(t *testing.T, h Harness) {
	s := txStore(t, h)
	id := newID(t)
	tx := mustBeginTx(t, s, id, fpA)
	if err := tx.Commit(ctx(t), response("done")); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(ctx(t), id)
	if err != nil || rec.State != request.Completed || string(rec.Response.Body) != "done" {
		t.Fatalf("record = %+v, %v; want COMPLETED with the response", rec, err)
	}
	c, err := s.BeginTx(ctx(t), id, fpA, time.Second)
	if err != nil || c.Tx != nil || c.Record.State != request.Completed || string(c.Record.Response.Body) != "done" {
		t.Fatalf("BeginTx after the commit = %+v, %v; want the completed record", c, err)
	}
	if err := tx.Rollback(ctx(t)); err == nil {
		t.Fatal("Rollback after Commit succeeded")
	}
}

func testTxRollback(t *testing.T, h Harness) {
	s := txStore(t, h)
	id := newID(t)
	if err := mustBeginTx(t, s, id, fpA).Rollback(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if rec, err := s.Get(ctx(t), id); !errors.Is(err, request.ErrNotFound) {
		t.Fatalf("record after the rollback = %+v, %v; want none", rec, err)
	}
	if err := mustBeginTx(t, s, id, fpA).Commit(ctx(t), response("second")); err != nil {
		t.Fatal(err)
	}
}

func testTxWaitsForCommit(t *testing.T, h Harness) {
	s := txStore(t, h)
	id := newID(t)
	tx := mustBeginTx(t, s, id, fpA)
	dup := beginTxAsync(t, s, id, time.Minute)
	time.Sleep(50 * time.Millisecond) // let the duplicate reach the index
	if err := tx.Commit(ctx(t), response("first")); err != nil {
		t.Fatal(err)
	}
	b := Recv(t, dup, "the duplicate's BeginTx")
	if b.err != nil || b.c.Tx != nil || b.c.Record.State != request.Completed || string(b.c.Record.Response.Body) != "first" {
		t.Fatalf("waiting duplicate = %+v, %v; want the first response", b.c, b.err)
	}
}

func testTxWaitsForRollback(t *testing.T, h Harness) {
	s := txStore(t, h)
	id := newID(t)
	tx := mustBeginTx(t, s, id, fpA)
	dup := beginTxAsync(t, s, id, time.Minute)
	time.Sleep(50 * time.Millisecond)
	if err := tx.Rollback(ctx(t)); err != nil {
		t.Fatal(err)
	}
	b := Recv(t, dup, "the duplicate's BeginTx")
	if b.err != nil || b.c.Tx == nil {
		t.Fatalf("waiting duplicate = %+v, %v; want the key, the first having rolled back", b.c, b.err)
	}
	if err := b.c.Tx.Commit(ctx(t), response("second")); err != nil {
		t.Fatal(err)
	}
}

func testTxWaitBounded(t *testing.T, h Harness) {
	s := txStore(t, h)
	id := newID(t)
	tx := mustBeginTx(t, s, id, fpA)
	defer tx.Rollback(ctx(t))
	b := Recv(t, beginTxAsync(t, s, id, 20*time.Millisecond), "the duplicate's BeginTx")
	if b.err != nil || b.c.Tx != nil || b.c.Record.State != request.InProgress {
		t.Fatalf("duplicate past its wait = %+v, %v; want IN_PROGRESS", b.c, b.err)
	}
}

func testTxConflict(t *testing.T, h Harness) {
	s := txStore(t, h)
	id := newID(t)
	if err := mustBeginTx(t, s, id, fpA).Commit(ctx(t), response("a")); err != nil {
		t.Fatal(err)
	}
	var conflict *request.ConflictError
	if c, err := s.BeginTx(ctx(t), id, fpB, time.Second); !errors.As(err, &conflict) || c.Tx != nil {
		t.Fatalf("BeginTx with another fingerprint = %+v, %v; want a *ConflictError", c, err)
	}
}

// testTxAfterLeased: both modes share the records: a leased attempt in
// flight is reported, and once released the transaction takes the key.
func testTxAfterLeased(t *testing.T, h Harness) {
	s := txStore(t, h)
	id := newID(t)
	l := mustAcquire(t, s, id, fpA, time.Minute)
	c, err := s.BeginTx(ctx(t), id, fpA, time.Second)
	if err != nil || c.Tx != nil || c.Record.State != request.InProgress || c.Record.Token != l.Token {
		t.Fatalf("BeginTx during a leased attempt = %+v, %v; want its IN_PROGRESS record", c, err)
	}
	if err := s.Release(ctx(t), l); err != nil {
		t.Fatal(err)
	}
	if err := mustBeginTx(t, s, id, fpA).Commit(ctx(t), response("tx")); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(ctx(t), id)
	if err != nil || rec.State != request.Completed || rec.Token <= l.Token {
		t.Fatalf("record = %+v, %v; want COMPLETED with a token above %d", rec, err, l.Token)
	}
}
