package consumer_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/inbox"
)

// v7At is a UUIDv7 carrying the time at.
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

// TestPartitionByKeyRefusesKeysItCannotPlace: under PartitionByKey a key
// that is not a UUIDv7, or whose time lies outside the partitions' span
// (ahead of the clock by more than PartitionsAhead buckets, or older than
// Retention), is dead-lettered at its first delivery with the reason,
// per message and in a batch, and its handler never runs. A key ahead of
// the clock is never applied, however often it is redelivered as the
// buckets move on; a key inside the span is applied once and its
// redeliveries after bucket switches are duplicates.
func TestPartitionByKeyRefusesKeysItCannotPlace(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	const interval = time.Second
	c := newConsumer(t, pool, insertOrder, consumer.Config{Inbox: inbox.Config{
		Partitioning: inbox.PartitionByKey, PartitionInterval: interval, Retention: 5 * interval}})
	ctx := context.Background()
	now := time.Now()
	ahead, old, fine := v7At(t, now.Add(10*interval)), v7At(t, now.Add(-time.Minute)), v7At(t, now)
	refused := map[string]string{
		"order-1":        "not a UUIDv7",
		uuid.NewString(): "not a UUIDv7", // version 4
		ahead:            "ahead",
		old:              "older than the Retention",
	}
	check := func(r consumer.Result, why string) {
		t.Helper()
		if r.Outcome != consumer.DeadLettered || !errors.Is(r.Err, inbox.ErrInvalidKey) || !errors.Is(r.Err, consumer.ErrInvalidMessage) || !strings.Contains(r.Err.Error(), why) {
			t.Fatalf("key %q: %+v, want DeadLettered at once with ErrInvalidKey saying %q", r.Key, r, why)
		}
	}
	for key, why := range refused {
		check(c.Process(ctx, msg(key, "p")), why)
	}
	var batch []*consumer.Message
	for key := range refused {
		batch = append(batch, msg(key, "p"))
	}
	batch = append(batch, msg(fine, "p"))
	rs := c.ProcessBatch(ctx, batch)
	for i, m := range batch[:len(refused)] {
		check(rs[i], refused[m.ID])
	}
	if r := rs[len(refused)]; r.Outcome != consumer.Applied {
		t.Fatalf("a key inside the span: %+v, want Applied", r)
	}
	// Redeliveries after the buckets moved on (the clamp of a key ahead
	// used to move with them): still never applied, and the key inside
	// the span stays a duplicate.
	for range 3 {
		time.Sleep(interval)
		if _, err := c.Store().GC(ctx, 0); err != nil {
			t.Fatal(err)
		}
		if r := c.Process(ctx, msg(ahead, "p")); r.Outcome == consumer.Applied {
			t.Fatalf("key ahead of the clock applied on redelivery: %+v", r)
		}
		if r := c.Process(ctx, msg(fine, "p")); r.Outcome != consumer.Duplicate {
			t.Fatalf("key inside the span on redelivery: %+v, want Duplicate", r)
		}
	}
	if n := orders(t, pool); n != 1 {
		t.Fatalf("%d orders applied, want 1 (the key inside the span, once)", n)
	}
}

// TestPlainConsumerOnAPartitionedInbox: a consumer whose Config is plain,
// on a table migrated partitioned, is refused with an ErrConfig that says
// what to do, by Migrate and by every claim, never a raw "no partition of
// relation" (SQLSTATE 23514); the reverse too.
func TestPlainConsumerOnAPartitionedInbox(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	newConsumer(t, pool, insertOrder, consumer.Config{Inbox: inbox.Config{Partitioning: inbox.PartitionByArrival}})
	plain, err := consumer.New(pool, "billing", insertOrder, consumer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.Migrate(ctx); !errors.Is(err, idemq.ErrConfig) || !strings.Contains(err.Error(), "partitioned") {
		t.Fatalf("Migrate of a plain Config on a partitioned table: %v, want an ErrConfig naming the layout", err)
	}
	// What idemq migrate calls after applying migrations.
	if err := plain.Store().EnsurePartitions(ctx); !errors.Is(err, idemq.ErrConfig) {
		t.Fatalf("EnsurePartitions of a plain Config on a partitioned table: %v, want an ErrConfig", err)
	}
	for _, r := range append(plain.ProcessBatch(ctx, []*consumer.Message{msg("order-2", "p")}), plain.Process(ctx, msg("order-1", "p"))) {
		if r.Outcome == consumer.Applied || !errors.Is(r.Err, idemq.ErrConfig) || strings.Contains(r.Err.Error(), "23514") {
			t.Fatalf("claim of a plain Config on a partitioned table: %+v, want an ErrConfig, not SQLSTATE 23514", r)
		}
	}

	other := setup(t)
	newConsumer(t, other, insertOrder, consumer.Config{})
	byKey, err := consumer.New(other, "billing", insertOrder, consumer.Config{Inbox: inbox.Config{Partitioning: inbox.PartitionByKey}})
	if err != nil {
		t.Fatal(err)
	}
	if r := byKey.Process(ctx, msg(v7At(t, time.Now()), "p")); !errors.Is(r.Err, idemq.ErrConfig) {
		t.Fatalf("claim of a partitioned Config on a plain table: %+v, want an ErrConfig", r)
	}
	if n := orders(t, pool) + orders(t, other); n != 0 {
		t.Fatalf("%d orders applied, want none", n)
	}
}
