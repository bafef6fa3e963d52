package request

import (
	"context"
	"errors"
	"time"
)

// TxStore is a [Store] that can also run a request in the transaction of
// its effects (the transaction-owning mode, pgstore's): the front end
// begins the transaction, claims the key in it, hands it to the handler and
// stores the response in it before it commits once. The handler's writes
// and the record commit together or not at all, so no lease, renewal or
// release is needed: a crash rolls both back. Choose it for handlers whose
// effects are all in that database; effects elsewhere (an HTTP call, an
// email, another database) need the leased mode.
type TxStore interface {
	Store
	// BeginTx begins a transaction and claims id in it, the claim sent
	// with the BEGIN. A transaction of another request holding the key
	// is waited for, up to wait: when it commits, BeginTx reports its
	// record; when it rolls back, the key is claimed. Past wait, or while
	// a leased attempt holds the key, TxClaim.Record is that InProgress
	// record. Errors are as for Store.Claim.
	BeginTx(ctx context.Context, id ID, fingerprint []byte, wait time.Duration) (TxClaim, error)
}

// TxClaim is the outcome of [TxStore.BeginTx]: Tx when the key was
// claimed, otherwise the stored Record.
type TxClaim struct {
	Tx     Tx
	Record Record
}

// Tx is a request's transaction in the transaction-owning mode. Its
// store-specific handle reaches the handler through the request's context
// (pgstore.Tx).
type Tx interface {
	// Commit stores resp as the request's outcome and commits the
	// transaction with the handler's writes.
	Commit(ctx context.Context, resp Response) error
	// Rollback ends the transaction without a trace: the handler's writes
	// and the claim are undone, and the next request with the key runs.
	Rollback(ctx context.Context) error
}

type txKey struct{}

// WithTx returns ctx carrying tx, for the handler of a request run in the
// transaction-owning mode.
func WithTx(ctx context.Context, tx Tx) context.Context { return context.WithValue(ctx, txKey{}, tx) }

// TxFrom returns the transaction ctx carries (see [WithTx]).
func TxFrom(ctx context.Context) (Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(Tx)
	return tx, ok
}

// TxDecision is the outcome of [Guard.BeginTx]: exactly one field is set.
type TxDecision struct {
	// Run is the transaction to run the request in, then commit or roll
	// back through the Guard's TxAttempt.
	Run *TxAttempt
	// Replay is the completed record whose response answers the request.
	Replay *Record
}

// TxWaitMin is the shortest wait of [Guard.BeginTx] for the key: the
// store bounds it with Postgres's lock_timeout, which also bounds the
// claim's other lock waits, such as the brief ones for the table's
// extension that concurrent inserts take turns at. A shorter bound would
// answer 409 to new keys under load.
const TxWaitMin = time.Second

// ErrNoTxStore is matched by the error of [Guard.BeginTx] on a store that
// is not a [TxStore].
var ErrNoTxStore = errors.New("request: the store cannot run requests in their transaction (it is not a request.TxStore); use pgstore, or the leased mode")

// BeginTx is [Guard.Begin] for the transaction-owning mode: it checks id,
// begins a transaction and claims the key in it. A duplicate waits for the
// transaction holding the key at most Config.Wait, and at least
// [TxWaitMin], and then gets the committed record to replay, or an
// *InFlightError. The other errors are Begin's.
func (g *Guard) BeginTx(ctx context.Context, id ID, fingerprint []byte) (TxDecision, error) {
	txs, ok := g.store.(TxStore)
	if !ok {
		return TxDecision{}, ErrNoTxStore
	}
	if err := g.cfg.Keys.Check(id); err != nil {
		return TxDecision{}, err
	}
	if err := CheckFingerprint(fingerprint); err != nil {
		return TxDecision{}, err
	}
	wait := max(g.cfg.Wait, TxWaitMin)
	ctx, cancel := context.WithTimeout(ctx, g.cfg.StoreTimeout+wait)
	defer cancel()
	c, err := bounded(ctx, func(ctx context.Context) (TxClaim, error) {
		return txs.BeginTx(ctx, id, fingerprint, wait)
	}, func(c TxClaim, err error) {
		if err == nil && c.Tx != nil { // nobody runs it: undo the claim
			ctx, cancel := g.storeContext(context.Background())
			defer cancel()
			_ = c.Tx.Rollback(ctx)
		}
	})
	var conflict *ConflictError
	switch {
	case err != nil && !errors.As(err, &conflict) && !errors.Is(err, ErrInvalidKey) && !errors.Is(err, ErrMisconfigured):
		return TxDecision{}, unavailable("claim", err)
	case err != nil:
		return TxDecision{}, err
	case c.Tx != nil:
		return TxDecision{Run: &TxAttempt{g: g, tx: c.Tx}}, nil
	case c.Record.State == Completed:
		return TxDecision{Replay: &c.Record}, nil
	}
	until := c.Record.LeaseUntil
	if until.IsZero() { // a transaction holds the key: no lease says for how long
		until = time.Now().Add(time.Second)
	}
	return TxDecision{}, &InFlightError{ID: id, LeaseUntil: until}
}

// TxAttempt is one run of a request in its transaction. Finish it with
// exactly one of Commit or Rollback.
type TxAttempt struct {
	g  *Guard
	tx Tx
}

// Context returns ctx carrying the attempt's transaction, for the handler
// (pgstore.Tx reads it).
func (a *TxAttempt) Context(ctx context.Context) context.Context { return WithTx(ctx, a.tx) }

// Commit stores resp (fitted to the store's limit, as by
// Attempt.Complete) and commits the transaction. An error is an
// ErrUnavailable: whether the transaction committed is then unknown to
// the caller, and a retry with the key finds out (it gets the response,
// or runs the request).
func (a *TxAttempt) Commit(ctx context.Context, resp Response) error {
	ctx, cancel := a.g.storeContext(context.WithoutCancel(ctx))
	defer cancel()
	resp = a.g.fit(resp)
	return a.g.finishErr("commit", boundedErr(ctx, func(ctx context.Context) error { return a.tx.Commit(ctx, resp) }))
}

// Rollback undoes the attempt: its writes and its claim.
func (a *TxAttempt) Rollback(ctx context.Context) error {
	ctx, cancel := a.g.storeContext(context.WithoutCancel(ctx))
	defer cancel()
	return a.g.finishErr("rollback", boundedErr(ctx, a.tx.Rollback))
}
