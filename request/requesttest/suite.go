// Package requesttest is the conformance suite of request.Store: every
// store (Postgres, Redis, DynamoDB) passes the same tests against its real
// server, so the front ends can rely on one contract.
//
// A store's test file is a few lines:
//
//	func TestConformance(t *testing.T) {
//		requesttest.Run(t, requesttest.Harness{New: func(t *testing.T, ttl time.Duration) request.Store { ... }})
//	}
package requesttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/request"
)

// Harness tells the suite how to make stores.
type Harness struct {
	// New returns a store whose records live recordTTL, isolated from the
	// stores of other tests (a fresh database, key prefix or table).
	New func(t *testing.T, recordTTL time.Duration) request.Store
	// Collect, if set, deletes expired records, for stores that forget
	// them by a periodic job rather than by themselves.
	Collect func(ctx context.Context, s request.Store) error
}

// lease is short enough for the takeover tests to wait it out, long
// enough that a loaded machine never loses a lease it should keep: those
// tests extend or hold leases of a minute.
const lease = 300 * time.Millisecond

// Run runs the suite; every subtest is parallel.
func Run(t *testing.T, h Harness) {
	tests := []struct {
		name string
		fn   func(t *testing.T, h Harness)
	}{
		{"ClaimNew", testClaimNew},
		{"InFlight", testInFlight},
		{"CompleteReplays", testCompleteReplays},
		{"Conflict", testConflict},
		{"ScopesIsolate", testScopesIsolate},
		{"Release", testRelease},
		{"TakeoverFencesLateHolder", testTakeover},
		{"LateCompleteWithoutTakeover", testLateComplete},
		{"Extend", testExtend},
		{"FinishOnce", testFinishOnce},
		{"GetMissing", testGetMissing},
		{"RecordTTL", testRecordTTL},
		{"TokenGrowsAfterExpiry", testTokenAfterExpiry},
		{"ConcurrentClaims", testConcurrentClaims},
		{"ConcurrentTakeovers", testConcurrentTakeovers},
		{"ResponseFidelity", testResponseFidelity},
	}
	if _, ok := store(t, h).(request.TxStore); ok {
		tests = append(tests, txTests...)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.fn(t, h)
		})
	}
}

var (
	fpA = request.Fingerprint([]byte("POST"), []byte("/orders"), []byte(`{"sku":"a"}`))
	fpB = request.Fingerprint([]byte("POST"), []byte("/orders"), []byte(`{"sku":"b"}`))
)

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c
}

// newID returns a key no other test uses.
var seq atomic.Int64

func newID(t *testing.T) request.ID {
	return request.ID{Scope: "tenant-1", Key: fmt.Sprintf("%s-%d-%d", t.Name(), time.Now().UnixNano(), seq.Add(1))}
}

func store(t *testing.T, h Harness) request.Store {
	return h.New(t, request.RecordTTLDefault)
}

func mustAcquire(t *testing.T, s request.Store, id request.ID, fp []byte, d time.Duration) idemq.Lease {
	t.Helper()
	c, err := s.Claim(ctx(t), id, fp, d)
	if err != nil {
		t.Fatalf("claim %v: %v", id, err)
	}
	if !c.Acquired {
		t.Fatalf("claim %v: not acquired, record %+v", id, c.Record)
	}
	return c.Lease
}

func mustHeld(t *testing.T, s request.Store, id request.ID, fp []byte) request.Record {
	t.Helper()
	c, err := s.Claim(ctx(t), id, fp, lease)
	if err != nil {
		t.Fatalf("claim %v: %v", id, err)
	}
	if c.Acquired {
		t.Fatalf("claim %v: acquired a key that should be held (token %d)", id, c.Lease.Token)
	}
	return c.Record
}

func response(body string) request.Response {
	return request.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(body)}
}

func testClaimNew(t *testing.T, h Harness) {
	s := store(t, h)
	id := newID(t)
	before := time.Now()
	l := mustAcquire(t, s, id, fpA, time.Minute)
	if (request.ID{Scope: l.Scope, Key: l.Key}) != id || l.Token <= 0 {
		t.Fatalf("lease = %+v, want id %v and a positive token", l, id)
	}
	if l.Until.Before(before.Add(50*time.Second)) || l.Until.After(before.Add(70*time.Second)) {
		t.Fatalf("lease until %v, want about a minute after %v", l.Until, before)
	}
	rec, err := s.Get(ctx(t), id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != request.InProgress || rec.Token != l.Token || !bytes.Equal(rec.Fingerprint, fpA) || rec.Response != nil {
		t.Fatalf("record = %+v, want IN_PROGRESS with token %d and fingerprint A", rec, l.Token)
	}
	if rec.ExpiresAt.Before(time.Now().Add(s.RecordTTL() / 2)) {
		t.Fatalf("record expires at %v, want about %v from now", rec.ExpiresAt, s.RecordTTL())
	}
}

func testInFlight(t *testing.T, h Harness) {
	s := store(t, h)
	id := newID(t)
	l := mustAcquire(t, s, id, fpA, time.Minute)
	rec := mustHeld(t, s, id, fpA)
	if rec.State != request.InProgress || rec.Token != l.Token {
		t.Fatalf("record = %+v, want IN_PROGRESS with token %d", rec, l.Token)
	}
	if rec.LeaseUntil.Sub(l.Until).Abs() > time.Second {
		t.Fatalf("record lease until %v, lease says %v", rec.LeaseUntil, l.Until)
	}
}

func testCompleteReplays(t *testing.T, h Harness) {
	s := store(t, h)
	id := newID(t)
	l := mustAcquire(t, s, id, fpA, time.Minute)
	want := response(`{"order":1}`)
	if err := s.Complete(ctx(t), l, want); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		rec := mustHeld(t, s, id, fpA)
		if rec.State != request.Completed || rec.Response == nil || !reflect.DeepEqual(*rec.Response, want) {
			t.Fatalf("record = %+v, want COMPLETED with %+v", rec, want)
		}
	}
	rec, err := s.Get(ctx(t), id)
	if err != nil || rec.State != request.Completed || !reflect.DeepEqual(*rec.Response, want) {
		t.Fatalf("Get = %+v, %v", rec, err)
	}
}

func testConflict(t *testing.T, h Harness) {
	s := store(t, h)
	id := newID(t)
	l := mustAcquire(t, s, id, fpA, time.Minute)
	check := func(state request.State) {
		t.Helper()
		c, err := s.Claim(ctx(t), id, fpB, lease)
		var conflict *request.ConflictError
		if !errors.As(err, &conflict) {
			t.Fatalf("claim with another fingerprint = %+v, %v; want a *ConflictError", c, err)
		}
		if conflict.ID != id || !bytes.Equal(conflict.Fingerprint, fpB) || !bytes.Equal(conflict.Stored.Fingerprint, fpA) || conflict.Stored.State != state {
			t.Fatalf("conflict = %+v, want the stored %s record with fingerprint A", conflict, state)
		}
	}
	check(request.InProgress)
	if err := s.Release(ctx(t), l); err != nil {
		t.Fatal(err)
	}
	check(request.Released)
	l = mustAcquire(t, s, id, fpA, time.Minute)
	if err := s.Complete(ctx(t), l, response("{}")); err != nil {
		t.Fatal(err)
	}
	check(request.Completed)
}

func testScopesIsolate(t *testing.T, h Harness) {
	s := store(t, h)
	id := newID(t)
	other := request.ID{Scope: "tenant-2", Key: id.Key}
	l := mustAcquire(t, s, id, fpA, time.Minute)
	if err := s.Complete(ctx(t), l, response("tenant 1")); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, s, other, fpB, time.Minute)
	if _, err := s.Get(ctx(t), request.ID{Scope: "", Key: id.Key}); !errors.Is(err, request.ErrNotFound) {
		t.Fatalf("Get in the empty scope = %v, want ErrNotFound", err)
	}
}

func testRelease(t *testing.T, h Harness) {
	s := store(t, h)
	id := newID(t)
	var last int64
	for range 3 {
		l := mustAcquire(t, s, id, fpA, time.Minute)
		if l.Token <= last {
			t.Fatalf("token %d after %d: fencing tokens must grow", l.Token, last)
		}
		last = l.Token
		if err := s.Release(ctx(t), l); err != nil {
			t.Fatal(err)
		}
		rec, err := s.Get(ctx(t), id)
		if err != nil || rec.State != request.Released || rec.Token != l.Token {
			t.Fatalf("after release: %+v, %v; want RELEASED with token %d", rec, err, l.Token)
		}
	}
}

func testTakeover(t *testing.T, h Harness) {
	s := store(t, h)
	id := newID(t)
	first := mustAcquire(t, s, id, fpA, lease)
	time.Sleep(lease + 100*time.Millisecond)
	second := mustAcquire(t, s, id, fpA, time.Minute)
	if second.Token <= first.Token {
		t.Fatalf("takeover token %d, first %d: must be larger", second.Token, first.Token)
	}
	if err := s.Complete(ctx(t), first, response("late")); !errors.Is(err, idemq.ErrLeaseLost) {
		t.Fatalf("late Complete = %v, want ErrLeaseLost", err)
	}
	if err := s.Release(ctx(t), first); !errors.Is(err, idemq.ErrLeaseLost) {
		t.Fatalf("late Release = %v, want ErrLeaseLost", err)
	}
	if _, err := s.Extend(ctx(t), first, time.Minute); !errors.Is(err, idemq.ErrLeaseLost) {
		t.Fatalf("late Extend = %v, want ErrLeaseLost", err)
	}
	want := response("second")
	if err := s.Complete(ctx(t), second, want); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx(t), first, response("later")); !errors.Is(err, idemq.ErrLeaseLost) {
		t.Fatalf("late Complete after the successor's = %v, want ErrLeaseLost", err)
	}
	rec := mustHeld(t, s, id, fpA)
	if rec.State != request.Completed || !reflect.DeepEqual(*rec.Response, want) {
		t.Fatalf("record = %+v, want the second attempt's response", rec)
	}
}

// testLateComplete: a lease that ran out still completes while nobody took
// the key over; its outcome is as good as any.
func testLateComplete(t *testing.T, h Harness) {
	s := store(t, h)
	id := newID(t)
	l := mustAcquire(t, s, id, fpA, lease)
	time.Sleep(lease + 100*time.Millisecond)
	if err := s.Complete(ctx(t), l, response("late")); err != nil {
		t.Fatalf("Complete after the lease ran out, not taken over: %v", err)
	}
	if rec := mustHeld(t, s, id, fpA); rec.State != request.Completed {
		t.Fatalf("record = %+v, want COMPLETED", rec)
	}
}

func testExtend(t *testing.T, h Harness) {
	s := store(t, h)
	id := newID(t)
	l := mustAcquire(t, s, id, fpA, lease)
	extended, err := s.Extend(ctx(t), l, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if extended.Token != l.Token || !extended.Until.After(l.Until) {
		t.Fatalf("extended = %+v, from %+v: want the same token and a later end", extended, l)
	}
	time.Sleep(lease + 100*time.Millisecond)
	if rec := mustHeld(t, s, id, fpA); rec.State != request.InProgress || rec.Token != l.Token {
		t.Fatalf("record = %+v, want still IN_PROGRESS under the extended lease", rec)
	}
	if err := s.Complete(ctx(t), extended, response("done")); err != nil {
		t.Fatal(err)
	}
}

func testFinishOnce(t *testing.T, h Harness) {
	s := store(t, h)
	id := newID(t)
	l := mustAcquire(t, s, id, fpA, time.Minute)
	if err := s.Complete(ctx(t), l, response("one")); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx(t), l, response("two")); !errors.Is(err, idemq.ErrLeaseLost) {
		t.Fatalf("second Complete = %v, want ErrLeaseLost", err)
	}
	if err := s.Release(ctx(t), l); !errors.Is(err, idemq.ErrLeaseLost) {
		t.Fatalf("Release after Complete = %v, want ErrLeaseLost", err)
	}
	if _, err := s.Extend(ctx(t), l, time.Minute); !errors.Is(err, idemq.ErrLeaseLost) {
		t.Fatalf("Extend after Complete = %v, want ErrLeaseLost", err)
	}
	if rec := mustHeld(t, s, id, fpA); string(rec.Response.Body) != "one" {
		t.Fatalf("record = %+v, want the first response", rec)
	}
}

func testGetMissing(t *testing.T, h Harness) {
	s := store(t, h)
	if _, err := s.Get(ctx(t), newID(t)); !errors.Is(err, request.ErrNotFound) {
		t.Fatalf("Get of a new key = %v, want ErrNotFound", err)
	}
	ghost := idemq.Lease{Scope: "tenant-1", Key: newID(t).Key, Token: 1, Until: time.Now().Add(time.Minute)}
	if err := s.Complete(ctx(t), ghost, response("x")); !errors.Is(err, idemq.ErrLeaseLost) {
		t.Fatalf("Complete of a key never claimed = %v, want ErrLeaseLost", err)
	}
	if err := s.Release(ctx(t), ghost); !errors.Is(err, idemq.ErrLeaseLost) {
		t.Fatalf("Release of a key never claimed = %v, want ErrLeaseLost", err)
	}
}

// testRecordTTL: a completed record outlives its lease by far, and is
// forgotten once its TTL ran out; the key is then new, for any request.
func testRecordTTL(t *testing.T, h Harness) {
	const ttl = time.Second
	s := h.New(t, ttl)
	if s.RecordTTL() != ttl {
		t.Fatalf("RecordTTL() = %v, want %v", s.RecordTTL(), ttl)
	}
	id := newID(t)
	l := mustAcquire(t, s, id, fpA, lease)
	if err := s.Complete(ctx(t), l, response("kept")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(lease + 100*time.Millisecond)
	if rec := mustHeld(t, s, id, fpA); rec.State != request.Completed {
		t.Fatalf("record = %+v, want COMPLETED after its lease time", rec)
	}
	time.Sleep(ttl + 1100*time.Millisecond)
	if h.Collect != nil {
		if err := h.Collect(ctx(t), s); err != nil {
			t.Fatal(err)
		}
	}
	if rec, err := s.Get(ctx(t), id); !errors.Is(err, request.ErrNotFound) {
		t.Fatalf("Get after the record TTL = %+v, %v; want ErrNotFound", rec, err)
	}
	next := mustAcquire(t, s, id, fpB, lease)
	if next.Token <= 0 {
		t.Fatalf("token %d", next.Token)
	}
}

// testTokenAfterExpiry: a record that expired and was forgotten (and
// collected, for a store with a GC job) starts again with a token above
// every token the key had, so that a downstream system keeping the
// highest token it saw takes the new holder and refuses the old one.
func testTokenAfterExpiry(t *testing.T, h Harness) {
	const ttl = time.Second
	s := h.New(t, ttl)
	id := newID(t)
	first := mustAcquire(t, s, id, fpA, lease)
	if err := s.Release(ctx(t), first); err != nil {
		t.Fatal(err)
	}
	last := mustAcquire(t, s, id, fpA, lease) // a stalled holder: never finishes
	if last.Token <= first.Token {
		t.Fatalf("token %d after %d: fencing tokens must grow", last.Token, first.Token)
	}
	time.Sleep(ttl + 1100*time.Millisecond)
	if h.Collect != nil {
		if err := h.Collect(ctx(t), s); err != nil {
			t.Fatal(err)
		}
	}
	if rec, err := s.Get(ctx(t), id); !errors.Is(err, request.ErrNotFound) {
		t.Fatalf("Get after the record TTL = %+v, %v; want ErrNotFound", rec, err)
	}
	next := mustAcquire(t, s, id, fpA, time.Minute)
	if next.Token <= last.Token {
		t.Fatalf("token %d after the record expired, %d before: a token must never go back", next.Token, last.Token)
	}
	if err := s.Complete(ctx(t), last, response("stale")); !errors.Is(err, idemq.ErrLeaseLost) {
		t.Fatalf("the stalled holder's Complete = %v, want ErrLeaseLost", err)
	}
	if err := s.Complete(ctx(t), next, response("fresh")); err != nil {
		t.Fatalf("the new holder's Complete: %v", err)
	}
}

// race runs n claims of id at once and returns the leases acquired and the
// records seen by the others.
func race(t *testing.T, s request.Store, id request.ID, n int) (leases []idemq.Lease, held []request.Record) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range n {
		wg.Go(func() {
			<-start
			c, err := s.Claim(ctx(t), id, fpA, time.Minute)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				t.Errorf("claim: %v", err)
			case c.Acquired:
				leases = append(leases, c.Lease)
			default:
				held = append(held, c.Record)
			}
		})
	}
	close(start)
	wg.Wait()
	return leases, held
}

func testConcurrentClaims(t *testing.T, h Harness) {
	s := store(t, h)
	id := newID(t)
	leases, held := race(t, s, id, 50)
	if len(leases) != 1 {
		t.Fatalf("%d of 50 concurrent claims acquired the key, want exactly 1", len(leases))
	}
	for _, rec := range held {
		if rec.State != request.InProgress || rec.Token != leases[0].Token {
			t.Fatalf("a losing claim saw %+v, want IN_PROGRESS with token %d", rec, leases[0].Token)
		}
	}
}

func testConcurrentTakeovers(t *testing.T, h Harness) {
	s := store(t, h)
	id := newID(t)
	first := mustAcquire(t, s, id, fpA, lease)
	time.Sleep(lease + 100*time.Millisecond)
	leases, _ := race(t, s, id, 20)
	if len(leases) != 1 {
		t.Fatalf("%d of 20 concurrent takeovers acquired the key, want exactly 1", len(leases))
	}
	if leases[0].Token <= first.Token {
		t.Fatalf("takeover token %d, first %d", leases[0].Token, first.Token)
	}
}

func testResponseFidelity(t *testing.T, h Harness) {
	s := store(t, h)
	for _, want := range []request.Response{
		{Status: 200},
		{Status: 404, Body: []byte{0, 1, 2, 0xff}},
		{Status: 201, Header: map[string][]string{"Location": {"/orders/1"}, "Link": {"<a>", "<b>"}, "X-Empty": {""}}, Body: bytes.Repeat([]byte("x"), 64<<10)},
	} {
		id := newID(t)
		l := mustAcquire(t, s, id, fpA, time.Minute)
		if err := s.Complete(ctx(t), l, want); err != nil {
			t.Fatal(err)
		}
		got := mustHeld(t, s, id, fpA).Response
		if got == nil || got.Status != want.Status || !bytes.Equal(got.Body, want.Body) || len(got.Header) != len(want.Header) {
			t.Fatalf("replayed %+v, want %+v", got, want)
		}
		for k, v := range want.Header {
			if !reflect.DeepEqual(got.Header[k], v) {
				t.Fatalf("header %s = %q, want %q", k, got.Header[k], v)
			}
		}
	}
}
