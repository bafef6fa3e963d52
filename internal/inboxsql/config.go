package inboxsql

import (
	"cmp"
	"strconv"
	"time"

	"github.com/idemq/idemq"
)

// The defaults of [Config].
const (
	SchemaDefault    = "public"
	TableDefault     = "idemq_inbox"
	MaxKeyLenDefault = 1024
	RetentionDefault = 7 * 24 * time.Hour

	ConnectionCheckIntervalDefault = 2 * time.Second
)

// ConnectionCheckDisabled as Config.ConnectionCheckInterval leaves the
// server's client_connection_check_interval alone (Postgres before 14 has
// none).
const ConnectionCheckDisabled time.Duration = -1

// Config configures an inbox table: package inbox documents it as
// inbox.Config, the one configuration a Store is opened from. The zero
// value is valid.
type Config struct {
	// Schema holds the inbox tables. Defaults to "public".
	Schema string
	// Table names the inbox table; its scopes table is Table + "_scopes".
	// Defaults to "idemq_inbox".
	Table string
	// MaxKeyLen bounds keys, in bytes. Defaults to 1024.
	MaxKeyLen int
	// Retention is how long a record is kept after its last change;
	// redeliveries later than that are applied again. Defaults to 7 days.
	Retention time.Duration
	// ConnectionCheckInterval is set as client_connection_check_interval
	// (SET LOCAL) in the transactions a consumer begins to claim keys,
	// unless the handle's connection config sets it already. Then a
	// consumer killed while its statement waits (on a lock, say) loses its
	// backend, and so its uncommitted claims, within about this interval
	// instead of whenever that statement ends: the next owner of the key
	// is not held up. It needs Postgres 14 or later on Linux; set
	// ConnectionCheckDisabled for older servers. Defaults to 2 seconds.
	ConnectionCheckInterval time.Duration
	// AsyncAcquire commits the claims of Acquire with synchronous_commit
	// off: the claim's transaction does not wait for its WAL to reach
	// disk, so a claim costs no flush of its own. Nothing else changes:
	// the claim is visible at once, and the transaction that completes
	// the lease (Complete, or CompleteTx with the caller's writes) commits
	// durably, which flushes the claim's earlier WAL with it. Only a
	// Postgres crash within about three wal_writer_delay of a claim can
	// forget it; the key then looks unclaimed, as after its lease ran out,
	// and the holder's finalize is fenced out. A Store on a pgx.Tx
	// ignores it, since the setting would last until that transaction
	// ends. Defaults to false.
	AsyncAcquire bool
	// Partitioning lays the table out in partitions whose expiry is a
	// DROP instead of DELETE and VACUUM (see [Partitioning]); Migrate
	// moves an existing table into the layout, and Down to version 7 out
	// of it. GC then drops expired partitions and creates the next ones.
	// Defaults to Unpartitioned.
	Partitioning Partitioning
	// PartitionInterval is the width of a partition's bucket, a whole
	// number of seconds; keep it the same for the life of the table.
	// Defaults to Retention under PartitionByArrival (where it may not be
	// less) and to 24 hours under PartitionByKey; set with Unpartitioned,
	// it is refused.
	PartitionInterval time.Duration
	// BoundaryGrace is how close to a bucket boundary a claim under
	// PartitionByArrival takes the advisory lock of its key first; a claim
	// transaction must commit within it, and the application's clock must
	// not be further than it from the database's. Defaults to 1 minute;
	// set with Unpartitioned, it is refused.
	BoundaryGrace time.Duration
}

// Partitioning is the layout of the inbox table (Config.Partitioning).
type Partitioning int

const (
	// Unpartitioned is one plain table, its records deleted by GC in
	// batches. The default.
	Unpartitioned Partitioning = iota
	// PartitionByArrival partitions records by their arrival time, in
	// buckets of Config.PartitionInterval, for keys of any form (Kafka
	// offsets, webhook-ids, HTTP keys). A claim probes the current and
	// the previous bucket; GC drops a bucket once the next one has ended,
	// so a record lives between one and two intervals, and the interval
	// is at least Retention. Two copies of one key claimed on either side
	// of a bucket boundary while both are uncommitted would each find
	// nothing: within Config.BoundaryGrace of a boundary (by the
	// database's clock), a claim first takes a transaction-scoped
	// advisory lock on its key, so the second waits for the first and
	// then sees its record. Claim transactions must commit within
	// BoundaryGrace and run at READ COMMITTED. RecordFailure and Acquire,
	// statements in transactions of their own, take no lock: their window
	// is one statement's duration.
	PartitionByArrival
	// PartitionByKey partitions records by the time in their key, for
	// inboxes whose keys are all UUIDv7 (idemq's outbox ids are): the
	// bucket is a function of the key, so uniqueness stays exact and
	// global and a claim probes one partition. A key that is not a
	// UUIDv7, or whose time lies outside the span of the partitions
	// (older than Retention, or more than PartitionsAhead buckets ahead of
	// the database's clock), is refused with ErrInvalidKey: its bucket
	// would move as time passes, and a redelivery could then be applied
	// again. GC drops a bucket once its end is Retention in the past: a
	// key is deduplicated for Retention after the time it carries.
	PartitionByKey
)

func (p Partitioning) String() string {
	switch p {
	case Unpartitioned:
		return "unpartitioned"
	case PartitionByArrival:
		return "by arrival"
	case PartitionByKey:
		return "by key"
	}
	return "Partitioning(" + strconv.Itoa(int(p)) + ")"
}

// The partitioning defaults of [Config].
const (
	// PartitionIntervalByKeyDefault is Config.PartitionInterval under
	// PartitionByKey; under PartitionByArrival it defaults to Retention.
	PartitionIntervalByKeyDefault = 24 * time.Hour
	BoundaryGraceDefault          = time.Minute
	// PartitionsAhead is how many buckets past the current one exist:
	// EnsurePartitions creates them, and a PartitionByKey key may be at
	// most that far ahead.
	PartitionsAhead = 2
)

// resolved returns c with its defaults filled in, or the error of its
// first invalid field (an *idemq.ConfigError of component).
func (c Config) resolved(component string) (Config, error) {
	if c.Partitioning == Unpartitioned {
		// Checked before the defaults fill them in.
		switch {
		case c.PartitionInterval != 0:
			return c, idemq.NewConfigError(component, "PartitionInterval", "%v is set but the inbox is Unpartitioned: set Partitioning too, or leave it zero", c.PartitionInterval)
		case c.BoundaryGrace != 0:
			return c, idemq.NewConfigError(component, "BoundaryGrace", "%v is set but the inbox is Unpartitioned: set Partitioning too, or leave it zero", c.BoundaryGrace)
		}
	}
	c.Schema = cmp.Or(c.Schema, SchemaDefault)
	c.Table = cmp.Or(c.Table, TableDefault)
	c.MaxKeyLen = cmp.Or(c.MaxKeyLen, MaxKeyLenDefault)
	c.Retention = cmp.Or(c.Retention, RetentionDefault)
	c.ConnectionCheckInterval = cmp.Or(c.ConnectionCheckInterval, ConnectionCheckIntervalDefault)
	if c.Partitioning != Unpartitioned {
		if c.PartitionInterval == 0 {
			c.PartitionInterval = PartitionIntervalByKeyDefault
			if c.Partitioning == PartitionByArrival {
				c.PartitionInterval = c.Retention
			}
		}
		c.BoundaryGrace = cmp.Or(c.BoundaryGrace, BoundaryGraceDefault)
	}
	return c, c.validate(component)
}

func (c Config) validate(component string) error {
	switch {
	case c.MaxKeyLen < 0:
		return idemq.NewConfigError(component, "MaxKeyLen", "%d is negative", c.MaxKeyLen)
	case c.Retention < 0:
		return idemq.NewConfigError(component, "Retention", "%v is negative", c.Retention)
	case c.Retention < time.Microsecond:
		return idemq.NewConfigError(component, "Retention", "%v is below Postgres's interval unit of 1µs", c.Retention)
	case c.ConnectionCheckInterval < 0 && c.ConnectionCheckInterval != ConnectionCheckDisabled:
		return idemq.NewConfigError(component, "ConnectionCheckInterval", "%v is negative; use ConnectionCheckDisabled to turn it off", c.ConnectionCheckInterval)
	case c.ConnectionCheckInterval > 0 && c.ConnectionCheckInterval < time.Millisecond:
		return idemq.NewConfigError(component, "ConnectionCheckInterval", "%v is below the server's unit of 1ms", c.ConnectionCheckInterval)
	case c.Partitioning < Unpartitioned || c.Partitioning > PartitionByKey:
		return idemq.NewConfigError(component, "Partitioning", "%d is not a Partitioning", int(c.Partitioning))
	case c.Partitioning == Unpartitioned:
		return nil
	case c.PartitionInterval < time.Second || c.PartitionInterval%time.Second != 0:
		return idemq.NewConfigError(component, "PartitionInterval", "%v is not a whole number of seconds", c.PartitionInterval)
	case c.Partitioning == PartitionByArrival && c.PartitionInterval < c.Retention:
		return idemq.NewConfigError(component, "PartitionInterval", "%v is below Retention (%v): claims probe two buckets, which must span Retention", c.PartitionInterval, c.Retention)
	case c.Partitioning == PartitionByArrival && (c.BoundaryGrace < 0 || 2*c.BoundaryGrace >= c.PartitionInterval):
		return idemq.NewConfigError(component, "BoundaryGrace", "%v: want a positive duration under half of PartitionInterval", c.BoundaryGrace)
	}
	return nil
}
