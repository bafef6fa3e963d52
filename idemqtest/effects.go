package idemqtest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/nilcheck"
)

// EffectsTable is the table [NewEffects] creates: one row per recorded
// side effect, numbered in the order the rows were written, and no unique
// constraint, so that a double apply shows as two rows.
const EffectsTable = "idemqtest_effects"

// DB is what [Effects] needs of a database: a *pgxpool.Pool, a *pgx.Conn
// or a pgx.Tx.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Execer is what [Effects.Record] writes through: the handler's pgx.Tx.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Effects counts side effects per key in a table of the test's database
// ([EffectsTable]). A transactional handler records through its own
// transaction, so an effect exists exactly when the handler's work
// committed: what a test reads back is what a user's business table would
// hold.
type Effects struct {
	db DB
}

// NewEffects creates [EffectsTable] on db (if it does not exist yet) and
// returns the recorder. A child process of a crash test calls it on the
// same database to record into the table its parent created. A nil db,
// or a table of that name that is not the kit's, fails tb saying what to
// do.
func NewEffects(tb testing.TB, db DB) *Effects {
	tb.Helper()
	if nilcheck.IsNil(db) {
		tb.Fatalf("idemqtest: NewEffects: db is nil; pass the test's database (a *pgxpool.Pool from testenv.Postgres)")
		return nil
	}
	ctx := context.Background()
	if _, err := db.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+EffectsTable+` (
		seq bigserial PRIMARY KEY,
		key text NOT NULL)`); err != nil {
		tb.Fatalf("idemqtest: create %s: %v", EffectsTable, err)
		return nil
	}
	// A table of that name made by something else has other columns.
	if _, err := db.Exec(ctx, `SELECT seq, key FROM `+EffectsTable+` LIMIT 0`); err != nil {
		tb.Fatalf("%v", missing(err))
		return nil
	}
	return &Effects{db: db}
}

// missing explains an undefined table (42P01) or column (42703) of
// EffectsTable: what is missing and what creates it.
func missing(err error) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && (pg.Code == "42P01" || pg.Code == "42703") {
		return fmt.Errorf("idemqtest: table %s lacks what the kit needs (%s): NewEffects creates it as (seq bigserial, key text); a table of that name made by something else must be dropped, or give the test a database of its own (testenv.Postgres): %w",
			EffectsTable, pg.Message, err)
	}
	return err
}

// errNilTx is the error of Record and RecordAll given no transaction.
var errNilTx = idemq.NewConfigError("idemqtest", "tx", "is nil: pass the handler's transaction, so that the effect commits with its work")

// Record writes one effect of key through tx, the handler's transaction.
// A nil tx is an idemq.ErrConfig.
func (e *Effects) Record(ctx context.Context, tx Execer, key string) error {
	if nilcheck.IsNil(tx) {
		return errNilTx
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+EffectsTable+` (key) VALUES ($1)`, key)
	return missing(err)
}

// RecordAll writes one effect of each key through tx in one statement, for
// a batch handler. A nil tx is an idemq.ErrConfig.
func (e *Effects) RecordAll(ctx context.Context, tx Execer, keys ...string) error {
	if nilcheck.IsNil(tx) {
		return errNilTx
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+EffectsTable+` (key) SELECT unnest($1::text[])`, keys)
	return missing(err)
}

// Load reads every committed effect, in the order they were written, into
// a [Recorder] snapshot to ask what it holds.
func (e *Effects) Load(tb testing.TB) *Recorder {
	tb.Helper()
	rows, err := e.db.Query(context.Background(), `SELECT key FROM `+EffectsTable+` ORDER BY seq`)
	if err != nil {
		tb.Fatalf("idemqtest: read %s: %v", EffectsTable, missing(err))
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		tb.Fatalf("idemqtest: read %s: %v", EffectsTable, err)
	}
	return &Recorder{seq: keys}
}

// Counts returns how many effects each key has.
func (e *Effects) Counts(tb testing.TB) map[string]int {
	tb.Helper()
	return e.Load(tb).Counts()
}

// Total returns how many effects there are, of all keys.
func (e *Effects) Total(tb testing.TB) int {
	tb.Helper()
	return e.Load(tb).Total()
}

// AssertOnce is [Recorder.AssertOnce] on the committed effects.
func (e *Effects) AssertOnce(tb testing.TB, keys ...string) {
	tb.Helper()
	e.Load(tb).AssertOnce(tb, keys...)
}

// Recorder counts side effects per key in memory, for effects that happen
// outside Postgres (a leased handler's HTTP call, a sent mail) and as the
// snapshot [Effects.Load] returns. The zero Recorder is ready to use and
// safe for concurrent use.
type Recorder struct {
	mu  sync.Mutex
	seq []string
}

// Record notes one effect of key.
func (r *Recorder) Record(key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq = append(r.seq, key)
}

// Sequence returns every key recorded, in the order of recording: a key
// recorded twice stands twice.
func (r *Recorder) Sequence() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.seq)
}

// Total returns how many effects were recorded, of all keys.
func (r *Recorder) Total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.seq)
}

// Counts returns how many effects each key has.
func (r *Recorder) Counts() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := make(map[string]int, len(r.seq))
	for _, k := range r.seq {
		m[k]++
	}
	return m
}

// Doubles returns the keys recorded more than once, with their counts: an
// effectively-once system keeps it empty.
func (r *Recorder) Doubles() map[string]int {
	m := r.Counts()
	maps.DeleteFunc(m, func(_ string, n int) bool { return n < 2 })
	return m
}

// AssertOnce fails tb unless each of keys was recorded exactly once and
// nothing else was recorded. It names every missing, doubled and
// unexpected key.
func (r *Recorder) AssertOnce(tb testing.TB, keys ...string) {
	tb.Helper()
	got := r.Counts()
	var problems []string
	for _, k := range keys {
		if n := got[k]; n != 1 {
			problems = append(problems, fmt.Sprintf("%s applied %d times", k, n))
		}
		delete(got, k)
	}
	for _, k := range slices.Sorted(maps.Keys(got)) {
		problems = append(problems, fmt.Sprintf("%s applied %d times but not expected", k, got[k]))
	}
	if len(problems) > 0 {
		tb.Errorf("idemqtest: want each of %d keys applied once: %s", len(keys), strings.Join(problems, "; "))
	}
}

// AssertOrder fails tb unless the first effects of the keys in each group
// stand in the order the group lists them: the per-key order of a relay
// or a partitioned consumer. Duplicates are left to [Recorder.AssertOnce].
func (r *Recorder) AssertOrder(tb testing.TB, groups ...[]string) {
	tb.Helper()
	first := map[string]int{}
	for i, k := range r.Sequence() {
		if _, ok := first[k]; !ok {
			first[k] = i
		}
	}
	for _, g := range groups {
		prev := -1
		for j, k := range g {
			p, ok := first[k]
			if !ok {
				tb.Errorf("idemqtest: %s was never applied", k)
				break
			}
			if p < prev {
				tb.Errorf("idemqtest: %s applied before %s", k, g[j-1])
				break
			}
			prev = p
		}
	}
}
