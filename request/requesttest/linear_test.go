package requesttest_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/request/requesttest"
)

// The linearizability check of one key's request record: many clients
// claim, complete and release a few keys of a real store at once, with
// leases short enough to run out in the middle (forced expiries) and, on a
// durable store, its server stopped and started; the history of each key
// must be explained by one sequential record, the model below.

type opKind uint8

const (
	opBegin opKind = iota
	opComplete
	opRelease
)

// recIn is an operation on one key: Begin with a fingerprint ("A" or "B"),
// Complete or Release with a token (and Complete with a response). Call
// and Return are the wall-clock bounds, in Unix nanoseconds, that the
// model compares with leases.
type recIn struct {
	key       string
	kind      opKind
	fp        string
	token     int64
	resp      string
	call, ret int64
}

type result uint8

const (
	resAcquired result = iota
	resInProgress
	resReplay
	resMismatch
	resOK
	resFenced
	// resUnknown: the store failed; the operation may or may not have
	// taken effect.
	resUnknown
)

var resultNames = [...]string{"Acquired", "InProgress", "Replay", "Mismatch", "OK", "Fenced", "Unknown"}

type recOut struct {
	res   result
	token int64
	until int64 // the lease acquired, Unix ns
	resp  string
}

// recState is the one record of a key. token is the latest token known,
// or a lower bound when a claim of unknown outcome may have taken the key
// (tokenUnknown); until is the holder's lease, -1 if unknown.
type recState struct {
	state        request.State // 0: no record
	fp           string
	token        int64
	tokenUnknown bool
	until        int64
	resp         string
}

// slack absorbs the clocks of client and store (the same machine) and
// the store's now() being its transaction's start.
const slack = int64(100 * time.Millisecond)

// recordModel is the sequential specification of one key's record. In
// the transaction-owning mode (tx) an attempt holds the key until its
// transaction ends, by its commit or rollback, or when its connection is
// lost (an outage), a rollback leaves no record,
// and InProgress ("busy past the wait") is a fair answer at any time: an
// attempt whose outcome the client never learnt may hold the key
// invisibly until its transaction is rolled back.
func recordModel(tx bool) porcupine.Model {
	claimable := func(s recState, in recIn) bool {
		switch s.state {
		case 0, request.Released:
			return true
		case request.InProgress:
			// A transaction also ends when its connection is lost (the
			// server rolls it back): its key is free again, and the old
			// holder's commit must then fail, which the model checks.
			return tx || s.until < 0 || s.until-slack <= in.ret
		}
		return false
	}
	held := func(s recState, token int64) bool {
		return s.state == request.InProgress && !s.tokenUnknown && s.token == token
	}
	ended := func(s recState) recState {
		if tx {
			return recState{token: s.token, tokenUnknown: s.tokenUnknown, until: -1}
		}
		s.state, s.until = request.Released, 0
		return s
	}
	m := porcupine.NondeterministicModel{
		Init: func() []any { return []any{recState{}} },
		Step: func(st, input, output any) []any {
			s, in, out := st.(recState), input.(recIn), output.(recOut)
			mismatch := s.state != 0 && s.fp != in.fp
			switch in.kind {
			case opBegin:
				switch out.res {
				case resAcquired:
					if !mismatch && claimable(s, in) && out.token > s.token {
						return []any{recState{state: request.InProgress, fp: in.fp, token: out.token, until: out.until}}
					}
				case resInProgress:
					if tx || (!mismatch && s.state == request.InProgress && (s.until < 0 || s.until+slack >= in.call)) {
						return []any{s}
					}
				case resReplay:
					if !mismatch && s.state == request.Completed && s.resp == out.resp {
						return []any{s}
					}
				case resMismatch:
					if mismatch {
						return []any{s}
					}
				case resUnknown:
					next := []any{s}
					if !tx && !mismatch && claimable(s, in) {
						next = append(next, recState{state: request.InProgress, fp: in.fp, token: s.token, tokenUnknown: true, until: -1})
					}
					return next
				}
			case opComplete, opRelease:
				done := recState{state: request.Completed, fp: s.fp, token: s.token, resp: in.resp}
				if in.kind == opRelease {
					done = ended(s)
				}
				switch out.res {
				case resOK:
					if held(s, in.token) {
						return []any{done}
					}
				case resFenced:
					if !held(s, in.token) {
						return []any{s}
					}
				case resUnknown:
					switch {
					case tx && held(s, in.token): // committed, or rolled back with its connection
						return []any{done, ended(s)}
					case held(s, in.token):
						return []any{s, done}
					}
					return []any{s}
				}
			}
			return nil
		},
		Equal: func(a, b any) bool { return a.(recState) == b.(recState) },
		DescribeOperation: func(input, output any) string {
			in, out := input.(recIn), output.(recOut)
			var op string
			switch in.kind {
			case opBegin:
				op = "Begin(" + in.fp + ")"
			case opComplete:
				op = fmt.Sprintf("Complete(%d, %s)", in.token, in.resp)
			case opRelease:
				op = fmt.Sprintf("Release(%d)", in.token)
			}
			desc := op + " → " + resultNames[out.res]
			switch out.res {
			case resAcquired:
				desc += fmt.Sprintf("(%d)", out.token)
			case resReplay:
				desc += "(" + out.resp + ")"
			}
			return desc
		},
		DescribeState: func(st any) string {
			s := st.(recState)
			if s.state == 0 {
				return "no record"
			}
			return fmt.Sprintf("%s fp %s token %d unknown %v resp %q", s.state, s.fp, s.token, s.tokenUnknown, s.resp)
		},
	}
	return m.ToModel()
}

// history records operations from many goroutines.
type history struct {
	mu  sync.Mutex
	ops []porcupine.Operation
}

func (h *history) add(client int, in recIn, out recOut) {
	ret := in.ret
	if out.res == resUnknown {
		ret = math.MaxInt64 // it may take effect at any time after its call
	}
	h.mu.Lock()
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Call: in.call, Output: out, Return: ret})
	h.mu.Unlock()
}

// byKey partitions the history per key.
func (h *history) byKey() map[string][]porcupine.Operation {
	parts := map[string][]porcupine.Operation{}
	for _, op := range h.ops {
		k := op.Input.(recIn).key
		parts[k] = append(parts[k], op)
	}
	return parts
}

// attempt is the store interface the clients drive: the leased mode on a
// request.Store, or the transaction-owning mode on a request.TxStore.
type attempt interface {
	begin(ctx context.Context, id request.ID, fp []byte) (recOut, func(ctx context.Context, complete bool, resp string) (recOut, error), error)
}

// leased drives Store.Claim, Complete and Release under a short lease.
type leased struct {
	s     request.Store
	lease time.Duration
}

func (l leased) begin(ctx context.Context, id request.ID, fp []byte) (recOut, func(context.Context, bool, string) (recOut, error), error) {
	c, err := l.s.Claim(ctx, id, fp, l.lease)
	if err != nil {
		return beginErr(err), nil, err
	}
	if !c.Acquired {
		return existing(c.Record), nil, nil
	}
	finish := func(ctx context.Context, complete bool, resp string) (recOut, error) {
		var err error
		if complete {
			err = l.s.Complete(ctx, c.Lease, request.Response{Status: 201, Body: []byte(resp)})
		} else {
			err = l.s.Release(ctx, c.Lease)
		}
		return finishOut(err), err
	}
	return recOut{res: resAcquired, token: c.Lease.Token, until: c.Lease.Until.UnixNano()}, finish, nil
}

// owned drives TxStore.BeginTx, Commit and Rollback.
type owned struct{ s request.TxStore }

func (o owned) begin(ctx context.Context, id request.ID, fp []byte) (recOut, func(context.Context, bool, string) (recOut, error), error) {
	c, err := o.s.BeginTx(ctx, id, fp, 50*time.Millisecond)
	if err != nil {
		return beginErr(err), nil, err
	}
	if c.Tx == nil {
		return existing(c.Record), nil, nil
	}
	// The transaction's claim has no token the client sees; the record's
	// token is read after the commit, so each acquisition gets its own.
	token := tokens.Add(1)
	finish := func(ctx context.Context, complete bool, resp string) (recOut, error) {
		var err error
		if complete {
			err = c.Tx.Commit(ctx, request.Response{Status: 201, Body: []byte(resp)})
		} else {
			err = c.Tx.Rollback(ctx)
		}
		return finishOut(err), err
	}
	return recOut{res: resAcquired, token: token}, finish, nil
}

// tokens numbers the transaction-owning mode's acquisitions, in order.
var tokens atomic.Int64

func beginErr(err error) recOut {
	if conflict := (*request.ConflictError)(nil); errors.As(err, &conflict) {
		return recOut{res: resMismatch}
	}
	return recOut{res: resUnknown}
}

func existing(rec request.Record) recOut {
	switch rec.State {
	case request.Completed:
		return recOut{res: resReplay, resp: string(rec.Response.Body)}
	case request.InProgress:
		return recOut{res: resInProgress}
	}
	return recOut{res: resUnknown} // a Released record is claimed, never returned
}

func finishOut(err error) recOut {
	switch {
	case err == nil:
		return recOut{res: resOK}
	case errors.Is(err, idemq.ErrLeaseLost):
		return recOut{res: resFenced}
	}
	return recOut{res: resUnknown}
}

// workload runs clients on keys for d, through a, and returns the history.
// Each client claims a random key (now and then with fingerprint B), and
// when it gets it, works for a while (sometimes past the lease), then
// completes (mostly) or releases it.
func workload(t *testing.T, a attempt, clients, keys int, lease, d time.Duration) *history {
	h := &history{}
	prefix := fmt.Sprintf("lin-%d-", time.Now().UnixNano())
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for n := 0; time.Now().Before(deadline); n++ {
				// A new set of keys every half second: many short histories.
				round := time.Since(start) / (500 * time.Millisecond)
				id := request.ID{Scope: "lin", Key: fmt.Sprintf("%s%d-%d", prefix, round, rand.IntN(keys))}
				fp := "A"
				if rand.IntN(10) == 0 {
					fp = "B"
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				in := recIn{key: id.Key, kind: opBegin, fp: fp, call: time.Now().UnixNano()}
				out, finish, _ := a.begin(ctx, id, []byte(fp))
				in.ret = time.Now().UnixNano()
				h.add(c, in, out)
				if finish != nil {
					time.Sleep(time.Duration(rand.Int64N(int64(lease) * 3 / 2))) // past the lease now and then
					in := recIn{key: id.Key, kind: opComplete, token: out.token, resp: fmt.Sprintf("c%d-%d", c, n), call: time.Now().UnixNano()}
					if rand.IntN(4) == 0 {
						in.kind, in.resp = opRelease, ""
					}
					out, _ := finish(ctx, in.kind == opComplete, in.resp)
					in.ret = time.Now().UnixNano()
					h.add(c, in, out)
				}
				cancel()
			}
		})
	}
	wg.Wait()
	return h
}

// check checks every key's history against the model and returns the
// keys whose history is not linearizable, each written as porcupine's HTML
// visualization into dir (if "", a new directory that outlives the test).
func check(t *testing.T, h *history, tx bool, dir string) (illegal []string) {
	t.Helper()
	model := recordModel(tx)
	parts := h.byKey()
	for key, ops := range parts {
		res, info := porcupine.CheckOperationsVerbose(model, ops, time.Minute)
		switch res {
		case porcupine.Illegal:
			if dir == "" {
				var err error
				if dir, err = os.MkdirTemp("", "idemq-linearizability-"); err != nil {
					t.Fatal(err)
				}
			}
			path := filepath.Join(dir, "linearizability-"+key+".html")
			if err := porcupine.VisualizePath(model, info, path); err != nil {
				t.Errorf("visualizing key %s: %v", key, err)
			}
			illegal = append(illegal, fmt.Sprintf("%s (%d operations; see %s)", key, len(ops), path))
		case porcupine.Unknown:
			t.Logf("key %s: the check of %d operations timed out", key, len(ops))
		}
	}
	t.Logf("%d operations on %d keys checked", len(h.ops), len(parts))
	return illegal
}

// unfenced is a broken store: a Complete refused by the fence reports
// success, as a store without fencing would.
type unfenced struct{ request.Store }

func (s unfenced) Complete(ctx context.Context, l idemq.Lease, resp request.Response) error {
	if err := s.Store.Complete(ctx, l, resp); !errors.Is(err, idemq.ErrLeaseLost) {
		return err
	}
	return nil
}

// TestLinearizabilityCatchesLostFence: the check finds the broken store
// out, so a pass of the real stores means something.
func TestLinearizabilityCatchesLostFence(t *testing.T) {
	t.Parallel()
	h := workload(t, leased{unfenced{requesttest.OpenPostgres(t)}, 50 * time.Millisecond}, 8, 2, 50*time.Millisecond, 2*time.Second)
	dir := t.TempDir()
	if illegal := check(t, h, false, dir); len(illegal) == 0 {
		t.Fatal("a store that reports fenced completions as done passed the check")
	}
}

// linearDuration is how long each store is driven: a few seconds in make
// test, IDEMQ_LINEAR_DURATION (make soak) for long.
func linearDuration(t *testing.T) time.Duration {
	if v := os.Getenv("IDEMQ_LINEAR_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("IDEMQ_LINEAR_DURATION=%q: %v", v, err)
		}
		return d
	}
	return 3 * time.Second
}

// TestLinearizableRecords drives each store (Postgres in both modes,
// Redis, DynamoDB) from many clients with leases that run out, and stops
// and starts the durable stores' servers meanwhile; every key's history
// must be linearizable.
func TestLinearizableRecords(t *testing.T) {
	const clients, keys = 8, 3
	lease := 150 * time.Millisecond
	d := linearDuration(t)
	for _, kind := range requesttest.Kinds {
		modes := []bool{false}
		if kind.Name == "postgres" {
			modes = append(modes, true)
		}
		for _, tx := range modes {
			name := kind.Name
			if tx {
				name += "-tx"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				s, server := kind.Open(t), requesttest.Switchable(nil)
				if kind.Durable {
					s, server = kind.Outage(t)
				}
				var a attempt = leased{s, lease}
				if tx {
					a = owned{s.(request.TxStore)}
				}
				stop := make(chan struct{})
				done := make(chan struct{})
				go func() { // outages: a server stopped for a moment, now and then
					defer close(done)
					for server != nil {
						select {
						case <-stop:
							return
						case <-time.After(time.Duration(300+rand.IntN(700)) * time.Millisecond):
						}
						server.Stop()
						time.Sleep(time.Duration(50+rand.IntN(200)) * time.Millisecond)
						server.Start()
					}
				}()
				h := workload(t, a, clients, keys, lease, d)
				close(stop)
				requesttest.Recv(t, done, "the outages to end")
				if illegal := check(t, h, tx, ""); len(illegal) > 0 {
					t.Fatalf("not linearizable: %v", illegal)
				}
			})
		}
	}
}
