package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/inboxsql"
	"github.com/idemq/idemq/internal/pgtx"
	"github.com/idemq/idemq/internal/pgutil"
	"github.com/idemq/idemq/request"
)

// The transaction-owning mode: the front end runs the request in a
// transaction whose first statement claims the key and whose last stores
// the response, so that the handler's writes and the record commit in one
// COMMIT. Round trips: BEGIN with the claim, the handler's own statements,
// the response's UPDATE with the COMMIT.

var _ request.TxStore = (*Store)(nil)

// ownedSQL are the statements of the transaction-owning mode.
type ownedSQL struct{ claim, complete string }

func newOwnedSQL(t pgutil.Table) ownedSQL {
	render := inboxsql.Render(t)
	return ownedSQL{
		// A new key is inserted; a released one, or one whose leased
		// attempt ran out, is taken over with a larger token, as by the
		// leased claim. A key held by another transaction makes this wait
		// on the unique index until it ends (bounded by lock_timeout);
		// then a committed record returns no row. The record is written
		// COMPLETED at once, which nobody sees before the commit: so it
		// takes no entry in the index of leases in flight, and complete,
		// which changes no indexed column (now() is the transaction's
		// start), is a HOT update. The bound of the wait is set before
		// the insert, in its FROM. $1 scope, $2 key id, $3 fingerprint,
		// $4 key text, $5 record TTL, $6 lock_timeout.
		claim: render(`
INSERT INTO {{table}} AS r (expires_at, key_id, scope_id, status, fingerprint, key_text, token)
SELECT now() + $5::interval, $2::uuid, $1::int, {{succeeded}}, $3::bytea, $4::text, {{now_us}}
FROM (SELECT set_config('lock_timeout', $6, true)) bound
ON CONFLICT (scope_id, key_id) DO UPDATE
SET attempts = r.attempts + 1, token = greatest(r.token + 1, excluded.token), status = {{succeeded}},
	owner = NULL, lease_until = NULL, result = NULL, last_error = NULL, updated_at = now(), expires_at = excluded.expires_at
WHERE r.fingerprint = excluded.fingerprint
	AND (r.status = {{failed_retryable}} OR (r.status = {{in_progress}} AND r.lease_until < now()))
RETURNING r.token`),
		// $1 scope, $2 key id, $3 token, $4 response.
		complete: render(`UPDATE {{table}} SET result = $4 WHERE scope_id = $1 AND key_id = $2 AND token = $3`),
	}
}

// errNotOwnable reports a Store on a handle it cannot begin transactions
// of its own on.
var errNotOwnable = fmt.Errorf("%w: pgstore: the transaction-owning mode needs a Store on a *pgxpool.Pool or a *pgx.Conn, not on a transaction", request.ErrMisconfigured)

// conn returns a connection of the Store's handle and how to hand it back.
func (s *Store) conn(ctx context.Context) (*pgx.Conn, func(), error) {
	switch db := s.db.(type) {
	case *pgxpool.Pool:
		c, err := db.Acquire(ctx)
		if err != nil {
			return nil, nil, err
		}
		return c.Conn(), c.Release, nil
	case *pgx.Conn:
		return db, func() {}, nil
	}
	return nil, nil, errNotOwnable
}

// BeginTx implements [request.TxStore.BeginTx]: BEGIN, the claim and the
// lock wait's bound travel in one round trip.
func (s *Store) BeginTx(ctx context.Context, id request.ID, fingerprint []byte, wait time.Duration) (request.TxClaim, error) {
	k, err := s.core.Resolve(ctx, scope(id), id.Key, fingerprint)
	switch {
	case errors.Is(err, inboxsql.ErrInvalidKey):
		return request.TxClaim{}, fmt.Errorf("%w: %w", request.ErrInvalidKey, err)
	case err != nil:
		return request.TxClaim{}, err
	}
	for range 2 {
		tx, err := s.claimTx(ctx, k, wait)
		if tx != nil || err != nil {
			if pg := (*pgconn.PgError)(nil); errors.As(err, &pg) && pg.Code == "55P03" { // lock_not_available
				return request.TxClaim{Record: request.Record{ID: id, Fingerprint: fingerprint, State: request.InProgress}}, nil
			}
			return request.TxClaim{Tx: tx}, err
		}
		rec, err := s.Get(ctx, id)
		if errors.Is(err, request.ErrNotFound) {
			continue // collected in between: claim it afresh
		}
		if err == nil && string(rec.Fingerprint) != string(fingerprint) {
			err = &request.ConflictError{ID: id, Fingerprint: fingerprint, Stored: rec}
		}
		return request.TxClaim{Record: rec}, err
	}
	return request.TxClaim{}, fmt.Errorf("pgstore: claim %q: record vanished twice", id.Key)
}

// claimTx begins a transaction that claims k, or returns nil when the key
// is someone else's (the transaction is then over).
func (s *Store) claimTx(ctx context.Context, k inboxsql.Key, wait time.Duration) (*ownedTx, error) {
	conn, release, err := s.conn(ctx)
	if err != nil {
		return nil, err
	}
	o := &ownedTx{s: s, release: release, k: k}
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	lockTimeout := strconv.FormatInt(max(wait.Milliseconds(), 1), 10)
	b.Queue(s.owned.claim, append(k.Args(s.ttl), lockTimeout)...).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&o.token)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		o.claimed = err == nil
		return err
	})
	b.Queue(`SET LOCAL lock_timeout TO DEFAULT`) // the handler's statements wait as usual
	results := conn.SendBatch(ctx, b)
	o.tx = results.Tx()
	err = results.Close()
	if err != nil || !o.claimed {
		return nil, errors.Join(err, o.end(ctx))
	}
	o.handler = pgtx.Handler(o.tx)
	return o, nil
}

// ownedTx is a request's transaction in the transaction-owning mode.
type ownedTx struct {
	s       *Store
	tx      pgx.Tx
	handler *pgtx.HandlerTx
	release func()
	k       inboxsql.Key
	token   int64
	claimed bool

	once sync.Once
}

// Commit implements [request.Tx.Commit]: the response's UPDATE and the
// COMMIT travel in one round trip.
func (o *ownedTx) Commit(ctx context.Context, resp request.Response) error {
	body, err := resp.MarshalBinary()
	if err != nil {
		return errors.Join(err, o.Rollback(ctx))
	}
	if err := o.handler.Aborted(); err != nil {
		return errors.Join(err, o.Rollback(ctx))
	}
	err = errTxDone
	o.once.Do(func() {
		defer o.release()
		b := &pgx.Batch{}
		b.Queue(o.s.owned.complete, o.k.ScopeID, o.k.ID, o.token, body).Exec(func(tag pgconn.CommandTag) error {
			if tag.RowsAffected() == 0 {
				return idemq.ErrLeaseLost // cannot happen while the claim's row lock holds
			}
			return nil
		})
		b.Queue("COMMIT")
		err = o.tx.SendBatch(ctx, b).Close()
		if conn := o.tx.Conn(); conn != nil && !conn.IsClosed() && conn.PgConn().TxStatus() != 'I' {
			err = errors.Join(err, o.tx.Rollback(ctx)) // the UPDATE failed, so the COMMIT never ran
		}
	})
	return err
}

// errTxDone reports a second Commit or Rollback.
var errTxDone = errors.New("pgstore: the request's transaction has already ended")

// Rollback implements [request.Tx.Rollback].
func (o *ownedTx) Rollback(ctx context.Context) error {
	err := errTxDone
	o.once.Do(func() { err = o.end(ctx) })
	return err
}

// end rolls the transaction back, unless it is over already, and hands
// its connection back.
func (o *ownedTx) end(ctx context.Context) error {
	defer o.release()
	if err := o.tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return err
	}
	return nil
}

// Tx returns the transaction of the request ctx belongs to, in the
// transaction-owning mode (idemhttp.Config.OwnTransaction,
// idemgrpc.ServerConfig.OwnTransaction): write the request's effects in
// it, and do not commit or roll it back (the front end does, once it has
// stored the response). ok is false outside such a request.
func Tx(ctx context.Context) (tx pgx.Tx, ok bool) {
	t, _ := request.TxFrom(ctx)
	o, ok := t.(*ownedTx)
	if !ok {
		return nil, false
	}
	return o.handler, true
}
