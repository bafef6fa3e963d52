package consumer

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/internal/inboxsql"
	"github.com/idemq/idemq/internal/pgtx"
)

// decideCase is one message of a batch as the database steps leave it, and
// what decide must make of it.
type decideCase struct {
	name  string
	claim inboxsql.BatchClaim
	err   error // what its handler (or its conflict's recording) returned

	outcome  Outcome // of the result; 0 when the message is retried alone
	attempts int
	errIs    error // the result's (or the failure's) error wraps it
	unclaim  bool  // the batch undoes its claim
	failure  bool  // the batch counts a failure and retries it alone
}

func decideCases() []decideCase {
	fresh := func(failures int) inboxsql.BatchClaim {
		return inboxsql.BatchClaim{ClaimResult: inboxsql.ClaimResult{New: true, Failures: failures}}
	}
	stored := func(rec inboxsql.Record) inboxsql.BatchClaim {
		return inboxsql.BatchClaim{ClaimResult: inboxsql.ClaimResult{Existing: &rec}}
	}
	conflict := &inbox.ConflictError{Key: "k", Fingerprint: []byte{2}, Stored: inbox.Record{Status: inbox.Succeeded, Fingerprint: []byte{1}}}
	pgErr := func(code string) error { return fmt.Errorf("insert order: %w", &pgconn.PgError{Code: code}) }
	boom := errors.New("boom")
	hookDown := errors.New("dead-letter hook: queue down")
	serialization := pgErr("40001")
	connLost, shutdown, outOfMemory := pgErr("08006"), pgErr("57P01"), pgErr("53200")
	timeout, unique := pgErr(pgerrcode57Timeout), pgErr("23505")
	permanentDeadlock := idemq.Permanent(pgErr("40P01"))
	panicked := guard("handler", func() error { panic("nil map") })
	tooMany := idemq.Permanent(fmt.Errorf("%w: 31 deliveries", ErrTooManyDeliveries))

	return []decideCase{
		{name: "stored success is a duplicate", claim: stored(inboxsql.Record{Status: inbox.Succeeded}), outcome: Duplicate},
		{name: "stored dead letter stays dead", claim: stored(inboxsql.Record{Status: inbox.FailedFinal, LastError: "poison", Attempts: 3}),
			outcome: DeadLettered, attempts: 3, errIs: ErrDeadLetter},
		{name: "key leased elsewhere is in progress", claim: stored(inboxsql.Record{Status: inbox.InProgress, LeaseUntil: time.Now().Add(time.Hour)}),
			outcome: Retry, errIs: ErrInProgress},
		{name: "recorded conflict", claim: inboxsql.BatchClaim{Err: conflict}, outcome: Conflict, errIs: conflict},
		{name: "conflict whose recording failed is retried", claim: inboxsql.BatchClaim{Err: conflict}, err: hookDown, outcome: Retry, errIs: hookDown},
		{name: "new message applied", claim: fresh(0), outcome: Applied, attempts: 1},
		{name: "applied after two failed attempts", claim: fresh(2), outcome: Applied, attempts: 3},
		{name: "handler error is a counted failure", claim: fresh(1), err: boom, failure: true, errIs: boom},
		{name: "swallowed SQL error is a counted failure", claim: fresh(0), err: pgtx.ErrAborted, failure: true, errIs: pgtx.ErrAborted},
		{name: "panic is a counted failure", claim: fresh(0), err: panicked, failure: true, errIs: panicked},
		{name: "over-delivered message is a counted failure", claim: fresh(0), err: tooMany, failure: true, errIs: ErrTooManyDeliveries},
		{name: "statement timeout is the handler's failure", claim: fresh(0), err: timeout, failure: true, errIs: timeout},
		{name: "constraint violation is the handler's failure", claim: fresh(0), err: unique, failure: true, errIs: unique},
		{name: "database error marked permanent is the handler's failure", claim: fresh(0), err: permanentDeadlock, failure: true, errIs: permanentDeadlock},
		{name: "serialization failure undoes the claim", claim: fresh(1), err: serialization, outcome: Retry, unclaim: true, errIs: serialization},
		{name: "lost connection undoes the claim", claim: fresh(0), err: connLost, outcome: Retry, unclaim: true, errIs: connLost},
		{name: "server shutdown undoes the claim", claim: fresh(0), err: shutdown, outcome: Retry, unclaim: true, errIs: shutdown},
		{name: "server out of resources undoes the claim", claim: fresh(0), err: outOfMemory, outcome: Retry, unclaim: true, errIs: outOfMemory},
		{name: "held behind a database error undoes the claim", claim: fresh(0), err: errHeld, outcome: Retry, unclaim: true, errIs: errHeld},
		{name: "conflict held behind a database error is retried", claim: inboxsql.BatchClaim{Err: conflict}, err: errHeld, outcome: Retry, errIs: errHeld},
	}
}

// checkDisposition reports how d differs from what c wants.
func checkDisposition(t *testing.T, c decideCase, key string, d disposition) {
	t.Helper()
	if d.unclaim != c.unclaim || (d.failure != nil) != c.failure {
		t.Fatalf("unclaim %v, failure %+v; want unclaim %v, failure %v", d.unclaim, d.failure, c.unclaim, c.failure)
	}
	if c.failure {
		if d.failure.failures != 0 || !errors.Is(d.failure.err, c.errIs) || d.result != (Result{}) {
			t.Fatalf("failure %+v, result %+v; want the handler's error %v, uncounted yet, and no result", d.failure, d.result, c.errIs)
		}
		return
	}
	r := d.result
	if r.Outcome != c.outcome || r.Key != key || r.Attempts != c.attempts {
		t.Fatalf("result %+v; want %v for key %q after %d attempts", r, c.outcome, key, c.attempts)
	}
	if c.errIs == nil && r.Err != nil || c.errIs != nil && !errors.Is(r.Err, c.errIs) {
		t.Fatalf("result error %v; want %v", r.Err, c.errIs)
	}
	if r.Outcome != Retry && r.RetryAfter != 0 || c.unclaim && r.RetryAfter != 0 {
		t.Fatalf("result %+v: retry-after set where the message is not waiting for another worker", r)
	}
	// Every Retry of a batch is the database's, but the wait for another
	// worker's lease.
	if want := r.Outcome == Retry && !errors.Is(r.Err, ErrInProgress); r.Unavailable != want {
		t.Fatalf("result %+v: Unavailable %v, want %v", r, r.Unavailable, want)
	}
}

// Every disposition a batch's transaction can reach, decided without a
// database from the claim and what the handler returned.
func TestDecideEachDisposition(t *testing.T) {
	t.Parallel()
	for _, c := range decideCases() {
		t.Run(c.name, func(t *testing.T) {
			ds := decide([]pending{{key: "k", claim: c.claim, err: c.err}})
			if len(ds) != 1 {
				t.Fatalf("%d dispositions for one message", len(ds))
			}
			checkDisposition(t, c, "k", ds[0])
		})
	}
}

// The message under another worker's lease is told when to come back.
func TestDecideInProgressWaitsForTheLease(t *testing.T) {
	t.Parallel()
	until := time.Now().Add(time.Hour)
	claim := inboxsql.BatchClaim{ClaimResult: inboxsql.ClaimResult{Existing: &inboxsql.Record{Status: inbox.InProgress, LeaseUntil: until}}}
	r := decide([]pending{{key: "k", claim: claim}})[0].result
	if r.RetryAfter <= 0 || r.RetryAfter > time.Hour {
		t.Fatalf("retry after %v; want the lease's remaining time, at most an hour", r.RetryAfter)
	}
}

// A batch holding every case at once decides each message on its own:
// dispositions keep the batch's order and no message's fate leaks into
// another's.
func TestDecideMixedBatch(t *testing.T) {
	t.Parallel()
	cases := decideCases()
	batch := make([]pending, len(cases))
	for i, c := range cases {
		batch[i] = pending{index: i, key: fmt.Sprintf("key-%d", i), claim: c.claim, err: c.err}
	}
	ds := decide(batch)
	if len(ds) != len(cases) {
		t.Fatalf("%d dispositions for %d messages", len(ds), len(cases))
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) { checkDisposition(t, c, batch[i].key, ds[i]) })
	}
}

// A later copy of a key in a batch: a Duplicate of an applied first copy,
// the first copy's result otherwise, processed alone with another payload.
func TestCopyResult(t *testing.T) {
	t.Parallel()
	deadErr := errors.New("poison")
	for _, c := range []struct {
		name        string
		first       Result
		samePayload bool
		want        Result
		alone       bool
	}{
		{"copy of an applied message is a duplicate", Result{Outcome: Applied, Key: "k", Attempts: 2}, true, Result{Outcome: Duplicate, Key: "k"}, false},
		{"copy of a duplicate is a duplicate", Result{Outcome: Duplicate, Key: "k"}, true, Result{Outcome: Duplicate, Key: "k"}, false},
		{"copy of a dead letter is dead", Result{Outcome: DeadLettered, Key: "k", Err: deadErr, Attempts: 3}, true, Result{Outcome: DeadLettered, Key: "k", Err: deadErr, Attempts: 3}, false},
		{"copy of a retried message is retried", Result{Outcome: Retry, Key: "k", Err: deadErr}, true, Result{Outcome: Retry, Key: "k", Err: deadErr}, false},
		{"copy of a conflict is a conflict", Result{Outcome: Conflict, Key: "k", Err: deadErr}, true, Result{Outcome: Conflict, Key: "k", Err: deadErr}, false},
		{"copy with another payload goes alone", Result{Outcome: Applied, Key: "k", Attempts: 1}, false, Result{}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, alone := copyResult(c.first, c.samePayload)
			if r != c.want || alone != c.alone {
				t.Fatalf("copyResult = %+v, alone %v; want %+v, alone %v", r, alone, c.want, c.alone)
			}
		})
	}
}
