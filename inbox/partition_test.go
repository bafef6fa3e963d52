package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/internal/inboxsql"
	"github.com/idemq/idemq/migrate"
	"github.com/idemq/idemq/testenv"
)

// partitions returns the partitions of the default inbox table.
func partitions(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	var names []string
	err := pool.QueryRow(context.Background(), `SELECT coalesce(array_agg(c.relname::text ORDER BY c.relname), '{}')
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'idemq_inbox'::regclass`).Scan(&names)
	if err != nil {
		t.Fatal(err)
	}
	return names
}

func rows(t *testing.T, pool *pgxpool.Pool, key string) (n int) {
	t.Helper()
	id, err := uuid.Parse(key)
	if err != nil {
		id = uuid.Nil
	}
	err = pool.QueryRow(context.Background(), `SELECT count(*) FROM idemq_inbox WHERE key_id = $1 OR key_text = $2`, id, key).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// v7At is a UUIDv7 carrying time at.
func v7At(t *testing.T, at time.Time) string {
	t.Helper()
	u, err := uuid.NewV7()
	if err != nil {
		t.Fatal(err)
	}
	ms := uint64(at.UnixMilli())
	for i := range 6 {
		u[i] = byte(ms >> (40 - 8*i))
	}
	return u.String()
}

// TestPartitionedClaims: in both partitioned modes a key is claimed once,
// its copies are duplicates, and every path that writes a record (claim,
// batch, failure, dead letter, lease) lands in one partition per key.
func TestPartitionedClaims(t *testing.T) {
	t.Parallel()
	for _, mode := range []inbox.Partitioning{inbox.PartitionByArrival, inbox.PartitionByKey} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, inbox.Config{Partitioning: mode})
			if got := partitions(t, b.pool); len(got) < 3 {
				t.Fatalf("partitions after Migrate: %v", got)
			}
			key := v7At(t, time.Now())
			if c, err := claimIn(t, b, key, "a", true); err != nil || !c.New {
				t.Fatalf("first claim: %+v, %v", c, err)
			}
			if c, err := claimIn(t, b, key, "a", true); err != nil || c.New || c.Existing == nil || c.Existing.Status != inbox.Succeeded {
				t.Fatalf("second claim: %+v, %v", c, err)
			}
			var conflict *inbox.ConflictError
			if _, err := claimIn(t, b, key, "b", true); !errors.As(err, &conflict) {
				t.Fatalf("other payload: %v, want a conflict", err)
			}
			ctx := context.Background()
			keys := []string{v7At(t, time.Now()), key, v7At(t, time.Now().Add(-time.Hour))}
			tx, claims, err := b.claims.BeginClaimBatch(ctx, "orders", []inboxsql.Item{{Key: keys[0], Fingerprint: fp("a")}, {Key: keys[1], Fingerprint: fp("a")}, {Key: keys[2], Fingerprint: fp("a")}})
			if err != nil {
				t.Fatal(err)
			}
			if !claims[0].New || claims[1].New || !claims[2].New {
				t.Fatalf("batch: %+v", claims)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			failed := v7At(t, time.Now())
			if _, err := b.claims.RecordFailure(ctx, "orders", failed, fp("a"), errors.New("boom")); err != nil {
				t.Fatal(err)
			}
			if _, err := b.claims.RecordFailure(ctx, "orders", failed, fp("a"), errors.New("boom")); err != nil {
				t.Fatal(err)
			}
			if c, err := claimIn(t, b, failed, "a", true); err != nil || !c.New || c.Failures != 2 {
				t.Fatalf("claim after two failures: %+v, %v", c, err)
			}
			leased := v7At(t, time.Now())
			a, err := b.store.Acquire(ctx, "orders", leased, fp("a"), "w1", time.Minute)
			if err != nil || !a.New {
				t.Fatalf("acquire: %+v, %v", a, err)
			}
			if err := b.store.Complete(ctx, a.Lease, []byte("done")); err != nil {
				t.Fatal(err)
			}
			if a, err := b.store.Acquire(ctx, "orders", leased, fp("a"), "w2", time.Minute); err != nil || a.New || string(a.Existing.Result) != "done" {
				t.Fatalf("acquire again: %+v, %v", a, err)
			}
			for _, k := range append(keys, failed, leased) {
				if n := rows(t, b.pool, k); n != 1 {
					t.Fatalf("key %s has %d records, want 1", k, n)
				}
			}
			if mode == inbox.PartitionByKey {
				if _, err := claimIn(t, b, "kafka/orders/0/42", "a", false); !errors.Is(err, inbox.ErrInvalidKey) {
					t.Fatalf("a key that is not a UUIDv7: %v, want ErrInvalidKey", err)
				}
			} else if c, err := claimIn(t, b, "kafka/orders/0/42", "a", true); err != nil || !c.New {
				t.Fatalf("a foreign key: %+v, %v", c, err)
			}
		})
	}
}

// TestPartitionBoundaryRace races copies of each key across a bucket
// boundary with real concurrent transactions: one copy claims just before
// the boundary and holds its transaction open past it, the other claims
// just after, while the first is uncommitted. The boundary's advisory
// lock makes the second wait and find the first's record: no key is
// applied twice.
func TestPartitionBoundaryRace(t *testing.T) {
	before, applied := raceBoundary(t, time.Second)
	t.Logf("%d of %d first copies claimed before the boundary", before, raceKeys)
	if applied != raceKeys {
		t.Fatalf("%d keys raced across the boundary: applied %d times, want %d", raceKeys, applied, raceKeys)
	}
	// The first copies claim before the boundary unless the machine
	// stalled them past it; the race needs some that did not.
	if before == 0 {
		t.Fatalf("no first copy claimed before the boundary: nothing raced")
	}
}

// TestPartitionBoundaryRaceWithoutTheLock is the control: with a grace
// period too short to cover the race, copies on either side of the
// boundary are both applied. It logs what it saw and fails only when
// nothing raced, since how many doubles appear depends on the schedule.
func TestPartitionBoundaryRaceWithoutTheLock(t *testing.T) {
	before, applied := raceBoundary(t, time.Millisecond)
	t.Logf("without the lock: %d of %d first copies before the boundary, %d keys applied twice", before, raceKeys, applied-raceKeys)
	if before == 0 {
		t.Fatalf("no first copy claimed before the boundary: nothing raced")
	}
}

const raceKeys = 12

// raceBoundary races two copies of raceKeys keys across the next bucket
// boundary under PartitionByArrival with grace, and returns how many
// first copies claimed before the boundary and how many claims applied
// their message. It checks that the table holds one record per applied
// claim.
func raceBoundary(t *testing.T, grace time.Duration) (before, applied int) {
	const interval = 4 * time.Second
	u := testenv.PostgresURL(t)
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 2*raceKeys + 4
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ib, err := inbox.New(pool, inbox.Config{Partitioning: inbox.PartitionByArrival, Retention: interval, PartitionInterval: interval, BoundaryGrace: grace})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := ib.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	store := claimsOf(ib)
	// The next boundary at least a second away.
	now := time.Now()
	boundary := now.Truncate(interval).Add(interval)
	if boundary.Sub(now) < time.Second {
		boundary = boundary.Add(interval)
	}
	var n atomic.Int64
	var wg sync.WaitGroup
	for i := range raceKeys {
		key := fmt.Sprintf("webhook/msg_%d_%s", i, uuid.NewString())
		first := make(chan struct{})
		wg.Go(func() {
			time.Sleep(time.Until(boundary.Add(-600 * time.Millisecond)))
			tx, c, err := store.BeginClaim(ctx, "orders", key, fp("a"))
			close(first)
			if err != nil {
				t.Error(err)
				return
			}
			if c.New {
				n.Add(1)
			}
			// Hold the claim uncommitted past the boundary, while the
			// other copy claims.
			time.Sleep(time.Until(boundary.Add(500 * time.Millisecond)))
			if err := tx.Commit(ctx); err != nil {
				t.Error(err)
			}
		})
		wg.Go(func() {
			<-first
			time.Sleep(time.Until(boundary.Add(100 * time.Millisecond)))
			tx, c, err := store.BeginClaim(ctx, "orders", key, fp("a"))
			if err != nil {
				t.Error(err)
				return
			}
			if c.New {
				n.Add(1)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	var records int
	err = pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE bucket < $1) FROM idemq_inbox`,
		boundary.Unix()/int64(interval/time.Second)).Scan(&records, &before)
	if err != nil {
		t.Fatal(err)
	}
	if records != int(n.Load()) {
		t.Fatalf("%d records for %d applied claims", records, n.Load())
	}
	return before, int(n.Load())
}

// TestPartitionedGCDropsPartitions: GC drops whole expired partitions and
// keeps the live ones; a key older than Retention is refused.
func TestPartitionedGCDropsPartitions(t *testing.T) {
	t.Parallel()
	b := setup(t, inbox.Config{Partitioning: inbox.PartitionByKey, Retention: time.Hour, PartitionInterval: time.Hour})
	ctx := context.Background()
	old := v7At(t, time.Now().Add(-3*time.Hour))
	if c, err := claimIn(t, b, old, "a", true); !errors.Is(err, inbox.ErrInvalidKey) {
		t.Fatalf("a key older than Retention: %+v, %v; want ErrInvalidKey", c, err)
	}
	fresh := v7At(t, time.Now())
	if c, err := claimIn(t, b, fresh, "a", true); err != nil || !c.New {
		t.Fatalf("fresh key: %+v, %v", c, err)
	}
	// A partition of three hours ago, as GC left one behind when it last
	// ran then, with a record.
	var bucket int64
	if err := b.pool.QueryRow(ctx, `SELECT floor(extract(epoch FROM now() - interval '3 hours') / 3600)::bigint`).Scan(&bucket); err != nil {
		t.Fatal(err)
	}
	expired := v7At(t, time.Now().Add(-3*time.Hour))
	for _, sql := range []string{
		fmt.Sprintf(`CREATE TABLE idemq_inbox_p%d PARTITION OF idemq_inbox FOR VALUES FROM (%d) TO (%d)`, bucket, bucket, bucket+1),
		fmt.Sprintf(`INSERT INTO idemq_inbox (bucket, expires_at, key_id, scope_id, status, fingerprint) VALUES (%d, now(), '%s', 1, 2, '\x01')`, bucket, expired),
	} {
		if _, err := b.pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	before := partitions(t, b.pool)
	if _, err := b.store.GC(ctx, 0); err != nil {
		t.Fatal(err)
	}
	after := partitions(t, b.pool)
	// Bucket 0, the empty table from before partitioning, goes too.
	if len(after) != len(before)-2 || slices.Contains(after, fmt.Sprintf("idemq_inbox_p%d", bucket)) || slices.Contains(after, "idemq_inbox_p0") {
		t.Fatalf("partitions before GC %v, after %v: want the expired one and bucket 0 dropped", before, after)
	}
	if rows(t, b.pool, expired) != 0 || rows(t, b.pool, fresh) != 1 || rows(t, b.pool, old) != 0 {
		t.Fatalf("after GC: expired key %d records, fresh %d, old %d; want 0, 1, 0", rows(t, b.pool, expired), rows(t, b.pool, fresh), rows(t, b.pool, old))
	}
}

// TestMigrateLiveInboxToPartitioned moves a plain inbox that claims keep
// writing to into the partitioned mode: PrepareLivePartitioning while
// claims run, then Migrate. Every key claimed before, during and after is
// a duplicate afterwards, none was applied twice, and Down to version 5
// brings every record back into a plain table.
func TestMigrateLiveInboxToPartitioned(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	ctx := context.Background()
	plain, err := inbox.New(pool, inbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	b := bundle{pool: pool, store: plain, claims: claimsOf(plain)}
	var claimed []string
	for i := range 200 {
		key := fmt.Sprintf("kafka/orders/0/%d", i)
		if c, err := claimIn(t, b, key, "a", true); err != nil || !c.New {
			t.Fatalf("claim %s: %+v, %v", key, c, err)
		}
		claimed = append(claimed, key)
	}

	// Claims go on while the table is prepared and migrated.
	stop := make(chan struct{})
	var mu sync.Mutex
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			key := fmt.Sprintf("kafka/orders/1/%d", i)
			tx, c, err := b.claims.BeginClaim(ctx, "orders", key, fp("a"))
			if err != nil {
				// The old Store's statements fail once the table is
				// partitioned; the new Store takes over below.
				return
			}
			if err := tx.Commit(ctx); err != nil || !c.New {
				t.Errorf("claim %s during the migration: %+v, %v", key, c, err)
				return
			}
			mu.Lock()
			claimed = append(claimed, key)
			mu.Unlock()
		}
	})
	if err := plain.PrepareLivePartitioning(ctx); err != nil {
		t.Fatal(err)
	}
	part, err := inbox.New(pool, inbox.Config{Partitioning: inbox.PartitionByArrival})
	if err != nil {
		t.Fatal(err)
	}
	if err := part.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	close(stop)
	wg.Wait()
	// The plain Store fails on the partitioned table rather than writing
	// records the partitioned claims would miss.
	if _, err := claimIn(t, b, "kafka/orders/3/0", "a", false); err == nil {
		t.Fatal("a claim through the plain Config succeeded on the partitioned table")
	}

	pb := bundle{pool: pool, store: part, claims: claimsOf(part)}
	for _, key := range claimed {
		if c, err := claimIn(t, pb, key, "a", true); err != nil || c.New {
			t.Fatalf("key %s claimed before the migration: %+v, %v; want a duplicate", key, c, err)
		}
	}
	if c, err := claimIn(t, pb, "kafka/orders/2/0", "a", true); err != nil || !c.New {
		t.Fatalf("new key after the migration: %+v, %v", c, err)
	}
	claimed = append(claimed, "kafka/orders/2/0")
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idemq_inbox`).Scan(&n); err != nil || n != len(claimed) {
		t.Fatalf("%d records, %v; want %d", n, err, len(claimed))
	}
	// GC keeps bucket 0 while it holds unexpired records.
	if _, err := part.GC(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if got := partitions(t, pool); got[0] != "idemq_inbox_p0" {
		t.Fatalf("partitions after GC: %v, want bucket 0 kept", got)
	}

	if err := undo(ctx, pool, part, 5); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idemq_inbox`).Scan(&n); err != nil || n != len(claimed) {
		t.Fatalf("after Down: %d records, %v; want %d", n, err, len(claimed))
	}
	for _, key := range claimed[:3] {
		if c, err := claimIn(t, b, key, "a", true); err != nil || c.New {
			t.Fatalf("key %s after Down: %+v, %v; want a duplicate", key, c, err)
		}
	}
}

// undo runs migrate's Down for s to version to.
func undo(ctx context.Context, pool *pgxpool.Pool, s *inbox.Store, to int) error {
	_, err := migrate.New(pool, s).Down(ctx, to)
	return err
}

// TestMigrateInboxToPartitionedByKey: UUIDv7 keys claimed in a plain
// inbox stay duplicates after it moved to PartitionByKey, where their
// records sit in bucket 0 rather than in their keys' buckets.
func TestMigrateInboxToPartitionedByKey(t *testing.T) {
	t.Parallel()
	b := setup(t, inbox.Config{})
	ctx := context.Background()
	var keys []string
	for range 50 {
		key := v7At(t, time.Now())
		if c, err := claimIn(t, b, key, "a", true); err != nil || !c.New {
			t.Fatalf("claim %s: %+v, %v", key, c, err)
		}
		keys = append(keys, key)
	}
	if err := b.store.PrepareLivePartitioning(ctx); err != nil {
		t.Fatal(err)
	}
	part, err := inbox.New(b.pool, inbox.Config{Partitioning: inbox.PartitionByKey})
	if err != nil {
		t.Fatal(err)
	}
	if err := part.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	pb := bundle{pool: b.pool, store: part, claims: claimsOf(part)}
	for _, key := range keys {
		if c, err := claimIn(t, pb, key, "a", true); err != nil || c.New {
			t.Fatalf("key %s claimed before the migration: %+v, %v; want a duplicate", key, c, err)
		}
		if n := rows(t, b.pool, key); n != 1 {
			t.Fatalf("key %s has %d records", key, n)
		}
	}
	if c, err := claimIn(t, pb, v7At(t, time.Now()), "a", true); err != nil || !c.New {
		t.Fatalf("a new key: %+v, %v", c, err)
	}
}

// TestPartitioningSettings: settings a partitioned layout cannot work
// with are ConfigErrors on the field at fault.
func TestPartitioningSettings(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	for _, c := range []struct {
		cfg   inbox.Config
		field string
	}{
		{inbox.Config{Partitioning: 7}, "Partitioning"},
		{inbox.Config{Partitioning: inbox.PartitionByKey, PartitionInterval: 1500 * time.Millisecond}, "PartitionInterval"},
		{inbox.Config{Partitioning: inbox.PartitionByArrival, Retention: 48 * time.Hour, PartitionInterval: 24 * time.Hour}, "PartitionInterval"},
		{inbox.Config{Partitioning: inbox.PartitionByArrival, PartitionInterval: 7 * 24 * time.Hour, BoundaryGrace: 4 * 24 * time.Hour}, "BoundaryGrace"},
		// Settings of a layout on an unpartitioned inbox would be ignored.
		{inbox.Config{PartitionInterval: time.Hour}, "PartitionInterval"},
		{inbox.Config{Partitioning: inbox.Unpartitioned, BoundaryGrace: time.Second}, "BoundaryGrace"},
	} {
		var ce *idemq.ConfigError
		if _, err := inbox.New(pool, c.cfg); !errors.As(err, &ce) || ce.Field != c.field {
			t.Errorf("%+v: %v, want a ConfigError on %s", c.cfg, err, c.field)
		}
	}
	// The interval defaults to the retention by arrival, 24 hours by key.
	for _, cfg := range []inbox.Config{
		{Partitioning: inbox.PartitionByArrival, Retention: time.Hour},
		{Partitioning: inbox.PartitionByKey},
	} {
		if _, err := inbox.New(pool, cfg); err != nil {
			t.Errorf("%+v: %v", cfg, err)
		}
	}
}
