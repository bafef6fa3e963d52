package idemqtest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/testenv"
)

// The Example's test, run.
func TestExample(t *testing.T) { testPaymentsAppliedOnce(t) }

// fakeTB records what a helper reports instead of failing the test.
type fakeTB struct {
	testing.TB
	mu     sync.Mutex
	failed []string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Fatal(args ...any) {
	f.mu.Lock()
	f.failed = append(f.failed, fmt.Sprint(args...))
	f.mu.Unlock()
}

func (f *fakeTB) Fatalf(format string, args ...any) { f.Fatal(fmt.Sprintf(format, args...)) }
func (f *fakeTB) Errorf(format string, args ...any) { f.Fatal(fmt.Sprintf(format, args...)) }

func (f *fakeTB) messages() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.Join(f.failed, "\n")
}

func TestWaitForReturnsOnceTheConditionHolds(t *testing.T) {
	t.Parallel()
	calls := 0
	idemqtest.WaitFor(t, "the third call", func() bool { calls++; return calls == 3 })
	if calls != 3 {
		t.Fatalf("cond called %d times, want 3", calls)
	}
}

func TestWaitForFailsWithWhatAndState(t *testing.T) {
	t.Parallel()
	f := &fakeTB{TB: t}
	idemqtest.WaitFor(f, "the impossible", func() bool { return false },
		idemqtest.Within(20*time.Millisecond), idemqtest.Explain(func() string { return "3 pending" }))
	if got := f.messages(); !strings.Contains(got, "gave up waiting for the impossible") || !strings.Contains(got, "3 pending") {
		t.Fatalf("failure %q names neither what was awaited nor the state", got)
	}
}

func TestWaitForGivesUpWhenTheContextEnds(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	f := &fakeTB{TB: t}
	start := time.Now()
	idemqtest.WaitFor(f, "nothing", func() bool { return false }, idemqtest.Until(ctx))
	if time.Since(start) > 10*time.Second || !strings.Contains(f.messages(), "context") {
		t.Fatalf("after %v: %q", time.Since(start), f.messages())
	}
}

func TestWaitForNoErrorReportsTheLastError(t *testing.T) {
	t.Parallel()
	f := &fakeTB{TB: t}
	idemqtest.WaitForNoError(f, "the server", func() error { return errors.New("connection refused") }, idemqtest.Within(10*time.Millisecond))
	if got := f.messages(); !strings.Contains(got, "gave up waiting for the server") || !strings.Contains(got, "connection refused") {
		t.Fatalf("failure %q", got)
	}
}

func TestRecorderReportsDoublesMissingAndStrays(t *testing.T) {
	t.Parallel()
	var r idemqtest.Recorder
	for _, k := range []string{"a", "b", "a", "stray"} {
		r.Record(k)
	}
	if d := r.Doubles(); len(d) != 1 || d["a"] != 2 {
		t.Errorf("Doubles = %v, want map[a:2]", d)
	}
	f := &fakeTB{TB: t}
	r.AssertOnce(f, "a", "b", "c")
	got := f.messages()
	for _, want := range []string{"a applied 2 times", "c applied 0 times", "stray applied 1 times but not expected"} {
		if !strings.Contains(got, want) {
			t.Errorf("AssertOnce said %q, want it to say %q", got, want)
		}
	}
	if strings.Contains(got, "b applied") {
		t.Errorf("AssertOnce complained about b, applied once: %q", got)
	}
}

func TestRecorderAssertOrder(t *testing.T) {
	t.Parallel()
	var r idemqtest.Recorder
	for _, k := range []string{"k1/0", "k2/0", "k1/1", "k2/1", "k1/0"} {
		r.Record(k)
	}
	f := &fakeTB{TB: t}
	r.AssertOrder(f, []string{"k1/0", "k1/1"}, []string{"k2/0", "k2/1"})
	if got := f.messages(); got != "" {
		t.Fatalf("in-order keys reported: %q", got)
	}
	r.AssertOrder(f, []string{"k2/1", "k2/0"})
	if got := f.messages(); !strings.Contains(got, "k2/0 applied before k2/1") {
		t.Fatalf("out-of-order keys not reported: %q", got)
	}
}

// A leased handler's side effect (a mail sent) lives outside Postgres; a
// Recorder counts it.
func ExampleRecorder() {
	var sent idemqtest.Recorder
	for _, key := range []string{"mail-1", "mail-2", "mail-1"} { // a redelivery the handler did not fence
		sent.Record(key)
	}
	fmt.Println("total:", sent.Total())
	fmt.Println("doubles:", sent.Doubles())
	fmt.Println("order:", sent.Sequence())
	// Output:
	// total: 3
	// doubles: map[mail-1:2]
	// order: [mail-1 mail-2 mail-1]
}

// TestEffectsAnswerBadInputLikeTheLibrary: a nil database fails the test
// saying what to pass, a nil transaction is an ErrConfig, and a table of
// the kit's name made by something else is named as such with what
// creates the right one, never a panic or a bare SQLSTATE.
func TestEffectsAnswerBadInputLikeTheLibrary(t *testing.T) {
	t.Parallel()
	for name, db := range map[string]idemqtest.DB{"nil": nil, "nil pool": (*pgxpool.Pool)(nil)} {
		f := &fakeTB{TB: t}
		if e := idemqtest.NewEffects(f, db); e != nil || !strings.Contains(f.messages(), "db is nil") {
			t.Errorf("NewEffects(%s): %v, %q; want a failure saying the db is nil", name, e, f.messages())
		}
	}

	pool := testenv.Postgres(t)
	ctx := context.Background()
	e := idemqtest.NewEffects(t, pool)
	for name, tx := range map[string]idemqtest.Execer{"nil": nil, "nil tx": (*pgxpool.Tx)(nil)} {
		if err := e.Record(ctx, tx, "k"); !errors.Is(err, idemq.ErrConfig) {
			t.Errorf("Record with a %s tx: %v, want an ErrConfig", name, err)
		}
		if err := e.RecordAll(ctx, tx, "k"); !errors.Is(err, idemq.ErrConfig) {
			t.Errorf("RecordAll with a %s tx: %v, want an ErrConfig", name, err)
		}
	}

	foreign := testenv.Postgres(t)
	if _, err := foreign.Exec(ctx, `CREATE TABLE `+idemqtest.EffectsTable+` (id int)`); err != nil {
		t.Fatal(err)
	}
	f := &fakeTB{TB: t}
	idemqtest.NewEffects(f, foreign)
	if got := f.messages(); !strings.Contains(got, "lacks what the kit needs") || !strings.Contains(got, "NewEffects creates it") {
		t.Errorf("NewEffects on a foreign table: %q, want what is missing and what creates it", got)
	}
	// A child that records into a table its parent never created.
	if err := e.Record(ctx, foreign, "k"); err == nil || !strings.Contains(err.Error(), "NewEffects creates it") {
		t.Errorf("Record into a foreign table: %v, want what is missing and what creates it", err)
	}
}
