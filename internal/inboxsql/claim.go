package inboxsql

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemq/idemq/internal/errclass"
	"github.com/idemq/idemq/internal/pgtx"
)

// Item is one key to claim, with the fingerprint of its payload.
type Item struct {
	Key         string
	Fingerprint []byte
}

// ClaimResult is the outcome of [Store.ClaimTx], [Store.BeginClaim] and
// [Store.DeadLetterTx].
type ClaimResult struct {
	// New reports that the caller now owns the key and must apply the
	// message. Otherwise Existing holds the stored record.
	New      bool
	Existing *Record
	// Failures counts the failed attempts before this claim (New only).
	Failures int
}

// BatchClaim is the outcome of one item of [Store.ClaimBatchTx].
type BatchClaim struct {
	ClaimResult
	// Err is the item's own error: a conflict (a *ConflictError) or an
	// ErrInvalidKey.
	Err error
}

// ClaimTx records key in tx as applied (SUCCEEDED). The record commits or
// rolls back with tx, so it exists exactly when the message's side effects
// in tx do: if tx rolls back, the key is unclaimed again.
//
// New reports that the caller must apply the message in tx: the key was
// unclaimed, or its earlier attempts failed (Failures counts them).
// Otherwise Existing is the stored record (a duplicate, a dead letter or a
// leased key) and, when its fingerprint differs, the error is the
// *ConflictError. If another transaction holds an uncommitted claim of the
// key, ClaimTx waits for it: then it sees a duplicate if that transaction
// commits and claims the key if it rolls back.
func (s *Store) ClaimTx(ctx context.Context, tx pgx.Tx, scope, key string, fingerprint []byte) (ClaimResult, error) {
	if pgtx.IsNil(tx) {
		return ClaimResult{}, ErrNilTx
	}
	k, err := s.Resolve(ctx, scope, key, fingerprint)
	if err != nil {
		return ClaimResult{}, err
	}
	return s.claim(ctx, tx, k)
}

// BeginClaim begins a transaction on the Store's handle and claims key in
// it as [Store.ClaimTx] does, in one round trip: the BEGIN travels with the
// claim. It is the fast path for callers that start a transaction per
// message. Unless the error is other than nil or a conflict, the
// caller owns tx and must commit or roll it back.
func (s *Store) BeginClaim(ctx context.Context, scope, key string, fingerprint []byte) (pgx.Tx, ClaimResult, error) {
	k, err := s.Resolve(ctx, scope, key, fingerprint)
	if err != nil {
		return nil, ClaimResult{}, err
	}
	b, inserted := s.claimBatch(k)
	tx, err := s.begin(ctx, b)
	if err != nil {
		return nil, ClaimResult{}, fmt.Errorf("inbox: claim %q: %w", key, noPartition(err))
	}
	if *inserted {
		return tx, ClaimResult{New: true}, nil
	}
	c, err := s.claimExisting(ctx, tx, k)
	if err != nil && c.Existing == nil { // not a conflict, which comes with the record
		return nil, ClaimResult{}, errors.Join(err, tx.Rollback(ctx))
	}
	return tx, c, err
}

// claimBatch is the pipeline of k's claim: the boundary lock where the
// layout takes one, then the insert, which sets *inserted when it took
// the key.
func (s *Store) claimBatch(k Key) (b *pgx.Batch, inserted *bool) {
	b, inserted = &pgx.Batch{}, new(bool)
	if s.sql.boundaryLock != "" {
		b.Queue(s.sql.boundaryLock, k.ScopeID, lockKeys(k.ID))
	}
	b.Queue(s.sql.claim, k.Args(s.cfg.Retention)...).Exec(func(tag pgconn.CommandTag) error {
		*inserted = tag.RowsAffected() == 1
		return nil
	})
	return b, inserted
}

// claim inserts the record of a new key, or takes over a failed one.
func (s *Store) claim(ctx context.Context, tx pgx.Tx, k Key) (ClaimResult, error) {
	b, inserted := s.claimBatch(k)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return ClaimResult{}, fmt.Errorf("inbox: claim %q: %w", k.Key, noPartition(err))
	}
	if *inserted {
		return ClaimResult{New: true}, nil
	}
	return s.claimExisting(ctx, tx, k)
}

// claimExisting is the duplicate path of a claim whose insert found a
// record: it reads the record and takes it over if its attempts failed.
// A record deleted meanwhile (by GC) is claimed afresh.
func (s *Store) claimExisting(ctx context.Context, tx pgx.Tx, k Key) (ClaimResult, error) {
	for range 3 {
		rec, found, err := s.storedRecord(ctx, tx, k)
		switch {
		case err != nil:
			return ClaimResult{}, err
		case !found:
			tag, err := tx.Exec(ctx, s.sql.claim, k.Args(s.cfg.Retention)...)
			if err != nil {
				return ClaimResult{}, fmt.Errorf("inbox: claim %q: %w", k.Key, noPartition(err))
			}
			if tag.RowsAffected() == 1 {
				return ClaimResult{New: true}, nil
			}
			continue
		}
		if rec, err = s.against(rec, k.Key, k.Fingerprint); err != nil || rec.Status != FailedRetryable {
			return ClaimResult{Existing: &rec}, err
		}
		var failures int32
		err = tx.QueryRow(ctx, s.sql.takeOver, k.ScopeID, k.ID, k.Fingerprint, s.cfg.Retention).Scan(&failures)
		if err == nil {
			return ClaimResult{New: true, Failures: int(failures)}, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return ClaimResult{}, fmt.Errorf("inbox: claim %q: %w", k.Key, err)
		}
		// Another claim completed or changed the record first: read it again.
	}
	return ClaimResult{}, fmt.Errorf("inbox: claim %q: the record kept changing", k.Key)
}

// RecordFailure counts a failed attempt at key on the Store's own handle,
// after the attempt's transaction rolled back: the record becomes (or
// stays) FAILED_RETRYABLE with cause as its last error and one more
// failure, so the count survives crashes and redeliveries. It returns the
// record as it stands: a record that another attempt completed or
// dead-lettered meanwhile is returned unchanged, and a different
// fingerprint is a conflict (a *ConflictError).
//
// Call it only for real failures of the message's handler: a crash, a
// lost connection or a cancelled context is not a failure.
func (s *Store) RecordFailure(ctx context.Context, scope, key string, fingerprint []byte, cause error) (Record, error) {
	k, err := s.Resolve(ctx, scope, key, fingerprint)
	if err != nil {
		return Record{}, err
	}
	for range 3 {
		var rec Scan
		err := s.db.QueryRow(ctx, s.sql.recordFailure, append(k.Args(s.cfg.Retention), errText(cause))...).Scan(rec.Dest()...)
		if err == nil {
			return rec.Record(scope, key), nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return Record{}, fmt.Errorf("inbox: record failure of %q: %w", key, noPartition(err))
		}
		found, ok, err := s.storedRecord(ctx, s.db, k)
		if err != nil {
			return Record{}, err
		}
		if ok {
			return s.against(found, key, k.Fingerprint)
		}
	}
	return Record{}, fmt.Errorf("inbox: record failure of %q: the record kept changing", key)
}

// FailClaimTx counts a failed attempt at a key that tx claimed (New from
// [Store.ClaimTx] or [Store.ClaimBatchTx]) when tx goes on and commits
// without the message's effects, as a batch does after rewinding the
// handler to its savepoint: the record becomes FAILED_RETRYABLE with cause
// and one more failure. If tx rolls back, so does the count and the claim.
func (s *Store) FailClaimTx(ctx context.Context, tx pgx.Tx, scope, key string, cause error) (Record, error) {
	if pgtx.IsNil(tx) {
		return Record{}, ErrNilTx
	}
	k, err := s.Resolve(ctx, scope, key, nil)
	if err != nil {
		return Record{}, err
	}
	var rec Scan
	err = tx.QueryRow(ctx, s.sql.failClaim, k.ScopeID, k.ID, errText(cause)).Scan(rec.Dest()...)
	if errors.Is(err, pgx.ErrNoRows) {
		return Record{}, fmt.Errorf("inbox: fail claim %q: the key is not claimed in this transaction", key)
	}
	if err != nil {
		return Record{}, fmt.Errorf("inbox: fail claim %q: %w", key, err)
	}
	return rec.Record(scope, key), nil
}

// UnclaimTx undoes the claim of key that tx made (New from [Store.ClaimTx]
// or [Store.ClaimBatchTx]) without counting a failure, for an attempt that
// says nothing about the message (a deadlock, a serialization failure)
// when tx goes on and commits: the key is as it was before the claim. If
// tx rolls back, so does the claim anyway.
func (s *Store) UnclaimTx(ctx context.Context, tx pgx.Tx, scope, key string) error {
	if pgtx.IsNil(tx) {
		return ErrNilTx
	}
	k, err := s.Resolve(ctx, scope, key, nil)
	if err != nil {
		return err
	}
	var n int64
	if err := tx.QueryRow(ctx, s.sql.unclaim, k.ScopeID, k.ID).Scan(&n); err != nil {
		return fmt.Errorf("inbox: unclaim %q: %w", key, err)
	}
	if n == 0 {
		return fmt.Errorf("inbox: unclaim %q: the key is not claimed in this transaction", key)
	}
	return nil
}

// DeadLetterTx records key in tx as FAILED_FINAL with cause and the number
// of failed attempts, so that redeliveries are recognised and not applied.
// It takes over a record whose attempts failed; any other stored record is
// kept and reported as by [Store.ClaimTx]. If tx rolls back, so does the
// dead letter.
func (s *Store) DeadLetterTx(ctx context.Context, tx pgx.Tx, scope, key string, fingerprint []byte, failures int, cause error) (ClaimResult, error) {
	if pgtx.IsNil(tx) {
		return ClaimResult{}, ErrNilTx
	}
	k, err := s.Resolve(ctx, scope, key, fingerprint)
	if err != nil {
		return ClaimResult{}, err
	}
	text := errText(cause)
	if text == "" {
		text = "dead letter"
	}
	for range 2 {
		tag, err := tx.Exec(ctx, s.sql.deadLetter, append(k.Args(s.cfg.Retention), failures, text, errclass.Of(text))...)
		if err != nil {
			return ClaimResult{}, fmt.Errorf("inbox: dead-letter %q: %w", key, noPartition(err))
		}
		if tag.RowsAffected() == 1 {
			return ClaimResult{New: true}, nil
		}
		rec, found, err := s.storedRecord(ctx, tx, k)
		if err != nil {
			return ClaimResult{}, err
		}
		if found {
			rec, err := s.against(rec, key, k.Fingerprint)
			return ClaimResult{Existing: &rec}, err
		}
	}
	return ClaimResult{}, fmt.Errorf("inbox: dead-letter %q: record vanished twice", key)
}

// ClaimBatchTx claims every item in tx, like [Store.ClaimTx] for each, with
// one statement for the new keys. Keys must be distinct. The result has one
// BatchClaim per item, in order; an invalid key or a conflict is reported
// in that BatchClaim's Err, not as the error, which is reserved for
// failures of the whole batch. If tx rolls back, so do all the claims.
func (s *Store) ClaimBatchTx(ctx context.Context, tx pgx.Tx, scope string, items []Item) ([]BatchClaim, error) {
	if pgtx.IsNil(tx) {
		return nil, ErrNilTx
	}
	scopeID, err := s.lookupScope(ctx, scope)
	if err != nil {
		return nil, err
	}
	claims := make([]BatchClaim, len(items))
	index := make(map[uuid.UUID]int, len(items))
	ids := make([]uuid.UUID, 0, len(items))
	fingerprints := make([][]byte, 0, len(items))
	texts := make([]*string, 0, len(items))
	for i, it := range items {
		if err := s.Validate(it.Key, it.Fingerprint); err != nil {
			claims[i].Err = err
			continue
		}
		id, text := KeyID(it.Key)
		if _, dup := index[id]; dup {
			return nil, fmt.Errorf("inbox: key %q appears twice in the batch", it.Key)
		}
		index[id] = i
		ids = append(ids, id)
		fingerprints = append(fingerprints, nonNil(it.Fingerprint))
		texts = append(texts, text)
	}
	if len(ids) == 0 {
		return claims, nil
	}

	if s.sql.boundaryLock != "" {
		if _, err := tx.Exec(ctx, s.sql.boundaryLock, scopeID, lockKeys(ids...)); err != nil {
			return nil, fmt.Errorf("inbox: boundary lock: %w", err)
		}
	}
	// The duplicate path, read only for keys the insert skipped; failed
	// keys are taken over, and a key GC deleted in between is claimed
	// again.
	for range 3 {
		skipped, err := s.claimMissing(ctx, tx, scopeID, ids, fingerprints, texts, index, claims)
		if err != nil || len(skipped) == 0 {
			return claims, err
		}
		if err := s.readBatch(ctx, tx, scope, scopeID, skipped, items, index, claims); err != nil {
			return nil, err
		}
		if err := s.takeOverBatch(ctx, tx, scopeID, skipped, index, claims); err != nil {
			return nil, err
		}
		ids, fingerprints, texts = unresolved(claims, index, ids, fingerprints, texts)
		if len(ids) == 0 {
			return claims, nil
		}
	}
	return nil, errors.New("inbox: claim batch: the records kept changing")
}

// BeginClaimBatch begins a transaction on the Store's handle and claims
// the items in it as [Store.ClaimBatchTx] does. Unless the error is not
// nil, the caller owns tx and must commit or roll it back.
func (s *Store) BeginClaimBatch(ctx context.Context, scope string, items []Item) (pgx.Tx, []BatchClaim, error) {
	if _, err := s.lookupScope(ctx, scope); err != nil {
		return nil, nil, err
	}
	tx, err := s.begin(ctx, &pgx.Batch{})
	if err != nil {
		return nil, nil, fmt.Errorf("inbox: claim batch: %w", err)
	}
	claims, err := s.ClaimBatchTx(ctx, tx, scope, items)
	if err != nil {
		return nil, nil, errors.Join(err, tx.Rollback(ctx))
	}
	return tx, claims, nil
}

// claimMissing inserts the keys and marks the claimed ones New; it returns
// the ids it skipped because they have a record.
func (s *Store) claimMissing(ctx context.Context, tx pgx.Tx, scopeID int32, ids []uuid.UUID, fingerprints [][]byte, texts []*string, index map[uuid.UUID]int, claims []BatchClaim) ([]uuid.UUID, error) {
	rows, err := tx.Query(ctx, s.sql.claimBatch, scopeID, ids, fingerprints, texts, s.cfg.Retention)
	if err != nil {
		return nil, fmt.Errorf("inbox: claim batch: %w", noPartition(err))
	}
	claimed, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, fmt.Errorf("inbox: claim batch: %w", noPartition(err))
	}
	for _, id := range claimed {
		claims[index[id]].New = true
	}
	if len(claimed) == len(ids) {
		return nil, nil
	}
	var skipped []uuid.UUID
	for _, id := range ids {
		if !claims[index[id]].New {
			skipped = append(skipped, id)
		}
	}
	return skipped, nil
}

// readBatch reads the records of the skipped keys into their claims.
func (s *Store) readBatch(ctx context.Context, tx pgx.Tx, scope string, scopeID int32, skipped []uuid.UUID, items []Item, index map[uuid.UUID]int, claims []BatchClaim) error {
	rows, err := tx.Query(ctx, s.sql.getBatch, scopeID, skipped)
	if err != nil {
		return fmt.Errorf("inbox: read batch records: %w", err)
	}
	var id uuid.UUID
	var rec Scan
	_, err = pgx.ForEachRow(rows, append([]any{&id}, rec.Dest()...), func() error {
		i := index[id]
		r, err := s.against(rec.Record(scope, items[i].Key), items[i].Key, nonNil(items[i].Fingerprint))
		claims[i] = BatchClaim{ClaimResult: ClaimResult{Existing: &r}, Err: err}
		return nil
	})
	if err != nil {
		return fmt.Errorf("inbox: read batch records: %w", err)
	}
	return nil
}

// takeOverBatch claims the skipped keys whose attempts failed. One that
// changed since it was read is left unresolved, to be read again.
func (s *Store) takeOverBatch(ctx context.Context, tx pgx.Tx, scopeID int32, skipped []uuid.UUID, index map[uuid.UUID]int, claims []BatchClaim) error {
	var ids []uuid.UUID
	var fingerprints [][]byte
	for _, id := range skipped {
		if c := claims[index[id]]; c.Err == nil && c.Existing != nil && c.Existing.Status == FailedRetryable {
			ids = append(ids, id)
			fingerprints = append(fingerprints, c.Existing.Fingerprint)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	rows, err := tx.Query(ctx, s.sql.takeOverBatch, scopeID, ids, fingerprints, s.cfg.Retention)
	if err != nil {
		return fmt.Errorf("inbox: claim batch: %w", err)
	}
	var id uuid.UUID
	var failures int32
	taken := make(map[uuid.UUID]bool, len(ids))
	_, err = pgx.ForEachRow(rows, []any{&id, &failures}, func() error {
		taken[id] = true
		claims[index[id]] = BatchClaim{ClaimResult: ClaimResult{New: true, Failures: int(failures)}}
		return nil
	})
	if err != nil {
		return fmt.Errorf("inbox: claim batch: %w", err)
	}
	for _, id := range ids {
		if !taken[id] {
			claims[index[id]] = BatchClaim{} // changed meanwhile: read it again
		}
	}
	return nil
}

// unresolved keeps the keys of a batch that neither were claimed nor found.
func unresolved(claims []BatchClaim, index map[uuid.UUID]int, ids []uuid.UUID, fingerprints [][]byte, texts []*string) ([]uuid.UUID, [][]byte, []*string) {
	n := 0
	for k, id := range ids {
		if c := claims[index[id]]; !c.New && c.Existing == nil && c.Err == nil {
			ids[n], fingerprints[n], texts[n] = id, fingerprints[k], texts[k]
			n++
		}
	}
	return ids[:n], fingerprints[:n], texts[:n]
}

// RecordConflictTx records in tx that a message of key with fingerprint
// conflicted with the key's record, or counts one more sighting. If tx
// rolls back, so does the record.
func (s *Store) RecordConflictTx(ctx context.Context, tx pgx.Tx, scope, key string, fingerprint []byte) error {
	if pgtx.IsNil(tx) {
		return ErrNilTx
	}
	k, err := s.Resolve(ctx, scope, key, fingerprint)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, s.sql.recordConflict, k.Args(s.cfg.Retention)...); err != nil {
		return fmt.Errorf("inbox: record conflict %q: %w", key, err)
	}
	return nil
}
