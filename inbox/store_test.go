package inbox_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/internal/inboxsql"
	"github.com/idemq/idemq/testenv"
)

type bundle struct {
	pool  *pgxpool.Pool
	store *inbox.Store
	// claims is the claim protocol consumers run (package consumer), on
	// the same table.
	claims *inboxsql.Store
}

// eachLayout runs test, in parallel, on a fresh inbox of each table
// layout: the plain table and one partitioned by arrival.
func eachLayout(t *testing.T, test func(*testing.T, bundle)) {
	for name, cfg := range map[string]inbox.Config{
		"plain":       {},
		"partitioned": {Partitioning: inbox.PartitionByArrival},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			test(t, setup(t, cfg))
		})
	}
}

func setup(t testing.TB, cfg inbox.Config) bundle {
	t.Helper()
	pool := testenv.Postgres(t)
	store, err := inbox.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return bundle{pool: pool, store: store, claims: claimsOf(store)}
}

// claimsOf is store's claim protocol, as package consumer runs it.
func claimsOf(store *inbox.Store) *inboxsql.Store { return (*inboxsql.Store)(store) }

func fp(s string) []byte {
	sum := sha256.Sum256([]byte(s))
	return sum[:]
}

// claimIn runs Claim in its own transaction and commits or rolls back.
func claimIn(t *testing.T, b bundle, key, payload string, commit bool) (inboxsql.ClaimResult, error) {
	t.Helper()
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	c, err := b.claims.ClaimTx(ctx, tx, "orders", key, fp(payload))
	if commit {
		if cerr := tx.Commit(ctx); cerr != nil {
			t.Fatal(cerr)
		}
	}
	return c, err
}

func TestMigrateIsIdempotentAndConcurrent(t *testing.T) {
	t.Parallel()
	b := setup(t, inbox.Config{Schema: "idemq", Table: "events_inbox"})
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() { errs <- b.store.Migrate(context.Background()) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var versions int
	if err := b.pool.QueryRow(context.Background(),
		`SELECT count(*) FROM idemq.idemq_migrations WHERE owner = 'inbox:idemq.events_inbox'`).Scan(&versions); err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob("../internal/inboxsql/migrations/*.up.sql")
	if err != nil {
		t.Fatal(err)
	}
	if versions != len(files) {
		t.Fatalf("migration log has %d versions, want one per migration: %d", versions, len(files))
	}
}

func TestNewRejectsInvalidConfig(t *testing.T) {
	t.Parallel()
	// A pool that never connects: New must judge the config alone.
	pool, err := pgxpool.New(context.Background(), "postgres://127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, cfg := range []inbox.Config{
		{Table: "Inbox"}, {Table: "in box"}, {Table: `x"; DROP TABLE y; --`}, {Schema: "1st"},
		{Table: strings.Repeat("t", 49)}, {MaxKeyLen: -1}, {Retention: -time.Second},
	} {
		if _, err := inbox.New(pool, cfg); !errors.Is(err, idemq.ErrConfig) {
			t.Errorf("New(%+v) = %v, want an ErrConfig", cfg, err)
		}
	}
	var nilPool *pgxpool.Pool
	for _, db := range []inbox.DB{nil, nilPool} {
		if _, err := inbox.New(db, inbox.Config{}); !errors.Is(err, idemq.ErrConfig) {
			t.Errorf("New(%#v) = %v, want an ErrConfig", db, err)
		}
	}
}

func TestClaimNewThenDuplicateThenConflict(t *testing.T) {
	t.Parallel()
	b := setup(t, inbox.Config{})
	c, err := claimIn(t, b, "order-1", "payload", true)
	if err != nil || !c.New {
		t.Fatalf("first claim = %+v, %v; want new", c, err)
	}
	c, err = claimIn(t, b, "order-1", "payload", true)
	if err != nil || c.New || c.Existing == nil || c.Existing.Status != inbox.Succeeded {
		t.Fatalf("second claim = %+v, %v; want a duplicate of a SUCCEEDED record", c, err)
	}
	_, err = claimIn(t, b, "order-1", "other payload", true)
	var conflict *inbox.ConflictError
	if !errors.As(err, &conflict) {
		t.Fatalf("claim with another payload: err = %v, want *ConflictError", err)
	}
	if string(conflict.Stored.Fingerprint) != string(fp("payload")) || conflict.Stored.Status != inbox.Succeeded || conflict.Stored.CreatedAt.IsZero() {
		t.Fatalf("conflict does not expose the stored record: %+v", conflict.Stored)
	}
}

func TestRolledBackClaimLeavesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, inbox.Config{})
	if c, err := claimIn(t, b, "k", "p", false); err != nil || !c.New {
		t.Fatalf("claim = %+v, %v", c, err)
	}
	if _, err := b.store.Get(context.Background(), "orders", "k"); !errors.Is(err, inbox.ErrNotFound) {
		t.Fatalf("after rollback Get = %v, want ErrNotFound", err)
	}
	if c, err := claimIn(t, b, "k", "p", true); err != nil || !c.New {
		t.Fatalf("claim after rollback = %+v, %v; want new", c, err)
	}
}

// A second transaction claiming a key held by an uncommitted first one waits
// and then follows the first one's fate.
// Two claims of one key serialise, for a new key on the primary key and
// for a key whose attempt failed on the row lock of the takeover: the
// second waits, then sees a duplicate if the first commits and claims the
// key if it rolls back.
func TestConcurrentClaimFollowsTheFirstTransaction(t *testing.T) {
	t.Parallel()
	for _, failedBefore := range []bool{false, true} {
		for _, commit := range []bool{true, false} {
			t.Run(fmt.Sprintf("failed before=%v/first commits=%v", failedBefore, commit), func(t *testing.T) {
				t.Parallel()
				concurrentClaims(t, failedBefore, commit)
			})
		}
	}
}

func concurrentClaims(t *testing.T, failedBefore, commit bool) {
	b := setup(t, inbox.Config{})
	ctx := context.Background()
	if failedBefore {
		if rec, err := b.claims.RecordFailure(ctx, "orders", "k", fp("p"), errors.New("x")); err != nil || rec.Failures != 1 {
			t.Fatalf("record failure: %+v, %v", rec, err)
		}
	}
	first, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if c, err := b.claims.ClaimTx(ctx, first, "orders", "k", fp("p")); err != nil || !c.New {
		t.Fatalf("first claim = %+v, %v", c, err)
	}
	second := make(chan inboxsql.ClaimResult)
	go func() {
		c, err := claimIn(t, b, "k", "p", true)
		if err != nil {
			t.Error(err)
		}
		second <- c
	}()
	waitForLockWait(t, b.pool)
	if commit {
		err = first.Commit(ctx)
	} else {
		err = first.Rollback(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
	c := <-second
	if c.New == commit {
		t.Fatalf("second claim New = %v after the first %s", c.New, map[bool]string{true: "committed", false: "rolled back"}[commit])
	}
	if rec, err := b.store.Get(ctx, "orders", "k"); err != nil || rec.Status != inbox.Succeeded {
		t.Fatalf("record after both: %+v, %v; want SUCCEEDED", rec, err)
	}
}

// waitForLockWait returns once some backend of the test database waits on a lock.
func waitForLockWait(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	idemqtest.WaitFor(t, "a claim waiting on the first transaction's lock", func() bool {
		var waiting bool
		err := pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock')`).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		return waiting
	})
}

func TestKeysAreStoredNativelyWhenTheyAreUUIDs(t *testing.T) {
	t.Parallel()
	b := setup(t, inbox.Config{})
	v7 := uuid.Must(uuid.NewV7()).String()
	v8 := "0190a0b1-2c3d-8e4f-9a0b-1c2d3e4f5a6b"
	for _, key := range []string{v7, strings.ToUpper(v7), v8, "order-42"} {
		if c, err := claimIn(t, b, key, "p", true); err != nil || !c.New {
			t.Fatalf("claim %q = %+v, %v", key, c, err)
		}
	}
	rows, err := b.pool.Query(context.Background(), `SELECT key_id::text, key_text FROM idemq_inbox`)
	if err != nil {
		t.Fatal(err)
	}
	texts := map[string]*string{}
	for rows.Next() {
		var id string
		var text *string
		if err := rows.Scan(&id, &text); err != nil {
			t.Fatal(err)
		}
		texts[id] = text
	}
	if len(texts) != 4 {
		t.Fatalf("%d records for 4 distinct keys", len(texts))
	}
	if text, ok := texts[v7]; !ok || text != nil {
		t.Fatalf("canonical UUID key not stored natively: %v", texts)
	}
	for id, text := range texts {
		if id != v7 && (text == nil || uuid.MustParse(id).Version() != 8) {
			t.Fatalf("key %v stored as %s without its text or not as a version-8 id", deref(text), id)
		}
	}
	if _, err := b.store.Get(context.Background(), "orders", v8); err != nil {
		t.Fatalf("a version-8 key must round-trip as text: %v", err)
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

func TestScopesAreIndependent(t *testing.T) {
	t.Parallel()
	b := setup(t, inbox.Config{})
	ctx := context.Background()
	for _, scope := range []string{"billing", "shipping"} {
		err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			c, err := b.claims.ClaimTx(ctx, tx, scope, "order-1", fp("p"))
			if err == nil && !c.New {
				err = fmt.Errorf("scope %s saw another scope's record", scope)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestBadInputIsRejectedBeforeAnyWrite(t *testing.T) {
	t.Parallel()
	b := setup(t, inbox.Config{MaxKeyLen: 16})
	ctx := context.Background()
	for name, key := range map[string]string{
		"empty": "", "over the limit": strings.Repeat("k", 17), "invalid UTF-8": "\xff\xfe", "NUL": "a\x00b",
	} {
		_, err := claimIn(t, b, key, "p", true)
		if !errors.Is(err, inbox.ErrInvalidKey) {
			t.Errorf("%s key: err = %v, want ErrInvalidKey", name, err)
		}
	}
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := b.claims.ClaimTx(ctx, tx, "orders", "k", make([]byte, 65)); err == nil {
		t.Error("a 65-byte fingerprint was accepted")
	}
	// The transaction is untouched and still usable.
	if c, err := b.claims.ClaimTx(ctx, tx, "orders", "k", fp("p")); err != nil || !c.New {
		t.Fatalf("claim after rejected input = %+v, %v", c, err)
	}
	var n int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM idemq_inbox`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("committed records = %d, %v; want 0 (nothing half-written)", n, err)
	}
}

func TestClaimBatch(t *testing.T) {
	t.Parallel()
	b := setup(t, inbox.Config{})
	ctx := context.Background()
	if c, err := claimIn(t, b, "seen", "p", true); err != nil || !c.New {
		t.Fatal(c, err)
	}
	if c, err := claimIn(t, b, "reused", "first", true); err != nil || !c.New {
		t.Fatal(c, err)
	}
	items := []inboxsql.Item{
		{Key: "new-1", Fingerprint: fp("p")},
		{Key: "seen", Fingerprint: fp("p")},
		{Key: "", Fingerprint: fp("p")},
		{Key: "reused", Fingerprint: fp("second")},
		{Key: uuid.NewString(), Fingerprint: nil},
	}
	var claims []inboxsql.BatchClaim
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		claims, err = b.claims.ClaimBatchTx(ctx, tx, "orders", items)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var conflict *inbox.ConflictError
	switch {
	case !claims[0].New || claims[0].Err != nil:
		t.Errorf("new key: %+v", claims[0])
	case claims[1].New || claims[1].Existing == nil || claims[1].Err != nil:
		t.Errorf("seen key: %+v", claims[1])
	case !errors.Is(claims[2].Err, inbox.ErrInvalidKey):
		t.Errorf("empty key: %+v", claims[2])
	case !errors.As(claims[3].Err, &conflict) || claims[3].New:
		t.Errorf("reused key: %+v", claims[3])
	case !claims[4].New:
		t.Errorf("uuid key without fingerprint: %+v", claims[4])
	}

	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := b.claims.ClaimBatchTx(ctx, tx, "orders", []inboxsql.Item{{Key: "a"}, {Key: "a"}})
		return err
	})
	if err == nil {
		t.Error("a batch with a repeated key was accepted")
	}
}

func TestDeadLetterIsRecognisedLater(t *testing.T) {
	t.Parallel()
	b := setup(t, inbox.Config{})
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := b.claims.DeadLetterTx(ctx, tx, "orders", "poison", fp("p"), 5, errors.New("boom"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	c, err := claimIn(t, b, "poison", "p", true)
	if err != nil || c.New || c.Existing.Status != inbox.FailedFinal || c.Existing.LastError != "boom" || c.Existing.Failures != 5 {
		t.Fatalf("claim of a dead letter = %+v, %v", c, err)
	}
}

func TestGCRemovesOnlyExpiredRecords(t *testing.T) {
	t.Parallel()
	b := setup(t, inbox.Config{})
	ctx := context.Background()
	for i := range 25 {
		if _, err := claimIn(t, b, fmt.Sprintf("k%d", i), "p", true); err != nil {
			t.Fatal(err)
		}
	}
	// 20 expired, among them one under a live lease; 5 still retained.
	if _, err := b.pool.Exec(ctx, `UPDATE idemq_inbox SET expires_at = now() - interval '1 second'
		WHERE key_text NOT IN ('k20', 'k21', 'k22', 'k23', 'k24')`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE idemq_inbox SET status = 1, lease_until = now() + interval '1 hour'
		WHERE key_text = 'k0'`); err != nil {
		t.Fatal(err)
	}
	removed, err := b.store.GC(ctx, 7) // three batches
	if err != nil {
		t.Fatal(err)
	}
	if removed != 19 {
		t.Fatalf("GC removed %d, want 19", removed)
	}
	var left []string
	rows, _ := b.pool.Query(ctx, `SELECT key_text FROM idemq_inbox ORDER BY key_text`)
	left, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(left, ",") != "k0,k20,k21,k22,k23,k24" {
		t.Fatalf("left after GC: %v", left)
	}
}

func TestBeginClaimClaimsWithTheBegin(t *testing.T) {
	t.Parallel()
	b := setup(t, inbox.Config{})
	ctx := context.Background()
	begin := func(payload string, commit bool) (inboxsql.ClaimResult, error) {
		tx, c, err := b.claims.BeginClaim(ctx, "orders", "k", fp(payload))
		if tx != nil {
			if commit {
				if cerr := tx.Commit(ctx); cerr != nil {
					t.Fatal(cerr)
				}
			} else if rerr := tx.Rollback(ctx); rerr != nil {
				t.Fatal(rerr)
			}
		}
		return c, err
	}
	if c, err := begin("p", false); err != nil || !c.New {
		t.Fatalf("first = %+v, %v", c, err)
	}
	if c, err := begin("p", true); err != nil || !c.New {
		t.Fatalf("after a rollback = %+v, %v; want new", c, err)
	}
	if c, err := begin("p", true); err != nil || c.New || c.Existing.Status != inbox.Succeeded {
		t.Fatalf("duplicate = %+v, %v", c, err)
	}
	if _, err := begin("q", true); !errors.As(err, new(*inbox.ConflictError)) {
		t.Fatalf("other payload: %v, want *ConflictError", err)
	}
	if _, _, err := b.claims.BeginClaim(ctx, "orders", "", nil); !errors.Is(err, inbox.ErrInvalidKey) {
		t.Fatalf("empty key: %v", err)
	}
}

// The transactions BeginClaim and BeginClaimBatch begin carry the
// connection check, unless the pool's connections set their own.
func TestClaimTransactionsSetTheConnectionCheck(t *testing.T) {
	t.Parallel()
	b := setup(t, inbox.Config{})
	ctx := context.Background()
	show := func(db inbox.DB, store *inbox.Store) (single, batch string) {
		claims := claimsOf(store)
		tx, _, err := claims.BeginClaim(ctx, "orders", uuid.NewString(), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if err := tx.QueryRow(ctx, `SHOW client_connection_check_interval`).Scan(&single); err != nil {
			t.Fatal(err)
		}
		btx, _, err := claims.BeginClaimBatch(ctx, "orders", []inboxsql.Item{{Key: uuid.NewString()}})
		if err != nil {
			t.Fatal(err)
		}
		defer btx.Rollback(ctx)
		if err := btx.QueryRow(ctx, `SHOW client_connection_check_interval`).Scan(&batch); err != nil {
			t.Fatal(err)
		}
		return single, batch
	}
	if single, batch := show(b.pool, b.store); single != "2s" || batch != "2s" {
		t.Errorf("default: %q and %q, want 2s", single, batch)
	}
	off, err := inbox.New(b.pool, inbox.Config{ConnectionCheckInterval: inbox.ConnectionCheckDisabled})
	if err != nil {
		t.Fatal(err)
	}
	if single, batch := show(b.pool, off); single != "0" || batch != "0" {
		t.Errorf("disabled: %q and %q, want the server's 0", single, batch)
	}
	cfg := b.pool.Config()
	cfg.ConnConfig.RuntimeParams["client_connection_check_interval"] = "5s"
	own, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	store, err := inbox.New(own, inbox.Config{ConnectionCheckInterval: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if single, batch := show(own, store); single != "5s" || batch != "5s" {
		t.Errorf("pool's own setting: %q and %q, want its 5s kept", single, batch)
	}
	if _, err := inbox.New(b.pool, inbox.Config{ConnectionCheckInterval: -time.Second}); !errors.Is(err, idemq.ErrConfig) {
		t.Errorf("negative interval: %v, want ErrConfig", err)
	}
}

// A nil transaction is an error from every Tx method, never a panic.
func TestNilTxIsAnError(t *testing.T) {
	t.Parallel()
	b := setup(t, inbox.Config{})
	ctx := context.Background()
	var tx pgx.Tx
	lease := idemq.Lease{Scope: "orders", Key: "k", Token: 1}
	calls := map[string]func() error{
		"ClaimTx": func() error { _, err := b.claims.ClaimTx(ctx, tx, "orders", "k", nil); return err },
		"ClaimBatchTx": func() error {
			_, err := b.claims.ClaimBatchTx(ctx, tx, "orders", []inboxsql.Item{{Key: "k"}})
			return err
		},
		"DeadLetterTx": func() error {
			_, err := b.claims.DeadLetterTx(ctx, tx, "orders", "k", nil, 1, errors.New("x"))
			return err
		},
		"FailClaimTx":      func() error { _, err := b.claims.FailClaimTx(ctx, tx, "orders", "k", errors.New("x")); return err },
		"CompleteTx":       func() error { return b.store.CompleteTx(ctx, tx, lease, nil) },
		"FailTx":           func() error { return b.store.FailTx(ctx, tx, lease, errors.New("x")) },
		"FailFinalTx":      func() error { return b.store.FailFinalTx(ctx, tx, lease, errors.New("x")) },
		"RecordConflictTx": func() error { return b.claims.RecordConflictTx(ctx, tx, "orders", "k", nil) },
		"PurgeTx":          func() error { _, err := b.store.PurgeTx(ctx, tx, inbox.DeadFilter{}); return err },
		"PurgeTx conflicts": func() error {
			_, err := b.store.PurgeTx(ctx, tx, inbox.DeadFilter{Conflicts: true})
			return err
		},
		"UnclaimTx": func() error { return b.claims.UnclaimTx(ctx, tx, "orders", "k") },
		"ReleaseTx conflicts": func() error {
			_, err := b.store.ReleaseTx(ctx, tx, inbox.DeadFilter{Conflicts: true})
			return err
		},
	}
	for _, nilTx := range []pgx.Tx{nil, (*pgxpool.Tx)(nil)} {
		tx = nilTx
		for name, call := range calls {
			if err := call(); !errors.Is(err, idemq.ErrConfig) {
				t.Errorf("%s with a %T(nil) tx: %v, want an idemq.ErrConfig", name, tx, err)
			}
		}
	}
}
