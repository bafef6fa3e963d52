package outbox

import (
	"cmp"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/nilcheck"
	"github.com/idemq/idemq/internal/outboxsql"
	"github.com/idemq/idemq/internal/pgutil"
	"github.com/idemq/idemq/migrate"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Limits on the parts of a [Message] that are not configurable: they keep
// every row insertable (a btree entry holds at most about 2.7 kB) so that
// an oversized field is a clear error from [Outbox.EnqueueTx] instead of a
// failed statement that aborts the caller's transaction.
const (
	// MaxDestinationLen is the longest destination in bytes.
	MaxDestinationLen = 1024
	// MaxKeyLen is the longest ordering key in bytes.
	MaxKeyLen = 1024
	// MaxHeadersLen bounds the JSON encoding of a message's headers.
	MaxHeadersLen = 64 << 10
)

// copyThreshold is the batch size from which Enqueue uses COPY instead of
// one multi-row INSERT: below it the INSERT is one round trip like COPY and
// needs no extra protocol exchange.
const copyThreshold = 256

// ErrInvalidMessage is matched (with errors.Is) by every error that
// [Outbox.EnqueueTx] returns for a message it refused before writing
// anything. The concrete error is an [*InvalidMessageError].
var ErrInvalidMessage = errors.New("outbox: invalid message")

// ErrPayloadTooLarge is matched, in addition to [ErrInvalidMessage], when a
// payload exceeds [Config.MaxPayload].
var ErrPayloadTooLarge = errors.New("outbox: payload too large")

// ErrNotMigrated is matched by the error of a call on a database whose
// outbox tables are missing or older than this version expects (Postgres's
// undefined table, column or schema): it says what to run, and wraps
// Postgres's own error.
var ErrNotMigrated = errors.New("outbox: the outbox tables are missing or out of date: " +
	"run `idemq migrate --components outbox` (with the outbox's --schema and --outbox-table) or Outbox.Migrate first")

// dbError wraps err, the database's error for the call what, marking a
// missing table, column or schema with [ErrNotMigrated].
func dbError(what string, err error) error {
	if pgutil.Undefined(err) {
		return fmt.Errorf("%w (%s): %w", ErrNotMigrated, what, err)
	}
	return fmt.Errorf("outbox: %s: %w", what, err)
}

// InvalidMessageError says which message of an Enqueue call was refused
// and why.
type InvalidMessageError struct {
	// Index is the position of the message in the Enqueue call.
	Index int
	// Field is "destination", "key", "payload" or "headers".
	Field string
	// Reason describes the problem.
	Reason string
	err    error
}

func (e *InvalidMessageError) Error() string {
	return fmt.Sprintf("outbox: invalid message %d: %s: %s", e.Index, e.Field, e.Reason)
}

// Is reports ErrInvalidMessage (and ErrPayloadTooLarge for payloads).
func (e *InvalidMessageError) Is(target error) bool {
	return target == ErrInvalidMessage || (e.err != nil && target == e.err)
}

// Message is one outbox message: what Enqueue writes, what the relay
// publishes (relay.Message) and what a [DeadLetter] keeps.
type Message struct {
	// ID becomes the message id downstream (Idempotency-Key, Nats-Msg-Id).
	// The zero UUID means: generate a UUIDv7.
	ID uuid.UUID
	// Destination picks the relay's Sink and, inside it, the topic,
	// subject or URL. Required; at most MaxDestinationLen bytes of UTF-8
	// without NUL.
	Destination string
	// Key orders messages: the relay publishes the messages of one key in
	// the order they were enqueued. Empty means unordered. At most
	// MaxKeyLen bytes of UTF-8 without NUL.
	Key string
	// Payload is published as is; nil is stored as empty. At most
	// Config.MaxPayload bytes.
	Payload []byte
	// Headers travel with the message (trace context, content type). Names
	// are HTTP tokens (RFC 9110: letters, digits and !#$%&'*+-.^_`|~);
	// values are UTF-8 without NUL, CR or LF.
	Headers map[string]string
}

// Defaults of [Config].
const (
	SchemaDefault         = "public"
	TableDefault          = "idemq_outbox"
	MaxPayloadDefault     = 1 << 20
	NotifyIntervalDefault = 5 * time.Millisecond
)

// Config configures an [Outbox]. The zero value is usable.
type Config struct {
	// Schema holds the tables. Defaults to "public".
	Schema string
	// Table is the outbox table; dead letters live in Table+"_dead". Lower
	// case letters, digits and underscores, at most 48 bytes. Defaults to
	// "idemq_outbox".
	Table string
	// MaxPayload is the largest payload in bytes Enqueue accepts. At most
	// [MaxPayloadMax]. Defaults to 1 MiB.
	MaxPayload int
	// Channel is the LISTEN/NOTIFY channel that wakes relays, at most 63
	// bytes. Defaults to the table name, prefixed with "<schema>." outside
	// the public schema, shortened with a hash where that exceeds 63 bytes.
	Channel string
	// DisableNotify stops Enqueue from sending NOTIFY; relays then find new
	// rows by polling only. Set it where EnqueueTx runs in transactions
	// that are prepared for a two-phase commit (PREPARE TRANSACTION): a
	// transaction that ran NOTIFY cannot be prepared.
	DisableNotify bool
	// NotifyInterval is the least time between two NOTIFYs of this Outbox
	// (see the package documentation). Negative notifies in every
	// transaction. Defaults to 5 ms.
	NotifyInterval time.Duration
	// Headers, if set, adds headers from the context of each EnqueueTx
	// call to every message it writes: it writes them into h, which starts
	// empty, and a message that already carries a header of the same name
	// keeps its own. [github.com/idemq/idemq/otelidemq.OutboxHeaders]
	// stores the trace context (traceparent, tracestate), so that the
	// relay and the consumers downstream continue the business
	// transaction's trace. It must be safe for concurrent use. Defaults to none: the outbox adds nothing.
	Headers func(ctx context.Context, h map[string]string)
}

func (c Config) withDefaults() Config {
	c.Schema = cmp.Or(c.Schema, SchemaDefault)
	c.Table = cmp.Or(c.Table, TableDefault)
	c.MaxPayload = cmp.Or(c.MaxPayload, MaxPayloadDefault)
	c.Channel = cmp.Or(c.Channel, defaultChannel(c.Schema, c.Table))
	c.NotifyInterval = cmp.Or(c.NotifyInterval, NotifyIntervalDefault)
	return c
}

func (c Config) validate() error {
	switch {
	case c.MaxPayload < 0:
		return idemq.NewConfigError("outbox", "MaxPayload", "%d is negative", c.MaxPayload)
	case c.MaxPayload > MaxPayloadMax:
		return idemq.NewConfigError("outbox", "MaxPayload", "%d is above the maximum of %d", c.MaxPayload, MaxPayloadMax)
	case len(c.Channel) > maxChannelLen || strings.IndexByte(c.Channel, 0) >= 0 || !utf8.ValidString(c.Channel):
		return idemq.NewConfigError("outbox", "Channel", "%q: want at most %d bytes of UTF-8 without NUL", c.Channel, maxChannelLen)
	}
	return nil
}

// MaxPayloadMax is the largest [Config.MaxPayload] accepted: 256 MiB. A
// payload is a bytea value that the relay holds in memory, with the rest
// of its batch, and hands to a broker; Postgres refuses a value over 1 GB
// outright, and no broker idemq publishes to takes one near it.
const MaxPayloadMax = 256 << 20

// maxChannelLen is Postgres' identifier limit, which NOTIFY channels obey.
const maxChannelLen = 63

// defaultChannel is "<table>" in the public schema and "<schema>.<table>"
// elsewhere; a name over 63 bytes keeps its first 54 bytes and ends with
// "_" and 8 hex digits of a hash of the whole name, so that it stays
// distinct and every process derives the same one.
func defaultChannel(schema, table string) string {
	name := table
	if schema != SchemaDefault {
		name = schema + "." + table
	}
	if len(name) <= maxChannelLen {
		return name
	}
	h := fnv.New32a()
	h.Write([]byte(name))
	return fmt.Sprintf("%s_%08x", name[:maxChannelLen-9], h.Sum32())
}

// Outbox writes messages inside the caller's transaction and manages the
// dead letters. It is safe for concurrent use.
type Outbox struct {
	db         DB
	cfg        Config
	table      pgutil.Table
	q          outboxsql.Queries
	lastNotify atomic.Int64 // unix nanoseconds of the last NOTIFY sent
}

// New validates cfg and returns an Outbox on db (a *pgxpool.Pool usually),
// which [Outbox.Enqueue], the dead-letter calls and [Outbox.Migrate] use.
// It does not touch the database; call Migrate once to create the tables.
func New(db DB, cfg Config) (*Outbox, error) {
	if nilcheck.IsNil(db) {
		return nil, idemq.NewConfigError("outbox", "db", "is nil: New needs a pool or a connection")
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	t, err := pgutil.ConfigTable("outbox", cfg.Schema, cfg.Table)
	if err != nil {
		return nil, err
	}
	return &Outbox{db: db, cfg: cfg, table: t, q: outboxsql.New(t)}, nil
}

// Migrate creates or upgrades the outbox and dead-letter tables on the
// Outbox's handle: [migrate.New] of this Outbox alone. It is safe to run
// from several processes, and beside the migrations of other idemq stores,
// at once.
func (o *Outbox) Migrate(ctx context.Context) error {
	_, err := migrate.New(o.db, o).Migrate(ctx)
	return err
}

// PendingMigrations returns the migrations Migrate would apply, in order;
// none once the tables are up to date.
func (o *Outbox) PendingMigrations(ctx context.Context) ([]migrate.Migration, error) {
	return migrate.New(o.db, o).Pending(ctx)
}

// MigrationSource implements [migrate.Store]: the outbox tables'
// migrations.
func (o *Outbox) MigrationSource() migrate.Source {
	return migrate.Source{Component: "outbox", Schema: o.cfg.Schema, Table: o.cfg.Table, Files: migrations, Dir: "migrations"}
}

// DB is what the outbox needs from a database handle: a *pgxpool.Pool, a
// *pgx.Conn and a pgx.Tx all satisfy it.
type DB = pgutil.DB

// Config returns the configuration in effect, defaults filled in: the
// relay reads the tables, channel and notify interval from it.
func (o *Outbox) Config() Config { return o.cfg }

// RetryNow makes the pending messages of destination that wait for a
// later time (a retry's backoff, a Sink's hold) due now, and returns how
// many; their attempts are kept. Use it when a destination is working
// again, say a re-enabled webhook endpoint or a fixed topic, to send its
// backlog at once instead of when each message's delay runs out. Messages
// parked behind a dead letter wait for Replay or Purge, and those in a
// batch being published are left to that batch. Order per key is kept: the
// relay still publishes a key's messages in order. Like Replay, RetryNow
// has the relays that own the partitions of the keys it touches read those
// partitions again, without waiting for their batches in flight.
func (o *Outbox) RetryNow(ctx context.Context, destination string) (int64, error) {
	n, err := inTx(ctx, o.db, func(tx pgx.Tx) (int64, error) {
		var keys []string
		var unkeyed bool
		if err := tx.QueryRow(ctx, o.q.Waiting, destination).Scan(&keys, &unkeyed); err != nil || (len(keys) == 0 && !unkeyed) {
			return 0, err
		}
		if _, err := tx.Exec(ctx, o.q.LockPartitions, keys, unkeyed); err != nil {
			return 0, err
		}
		var n int64
		if err := tx.QueryRow(ctx, o.q.RetryNow, destination, keys, unkeyed).Scan(&n); err != nil || n == 0 || o.cfg.DisableNotify {
			return n, err
		}
		// Sent at commit, when the rows are due.
		_, err := tx.Exec(ctx, o.q.Notify, o.cfg.Channel)
		return n, err
	})
	if err != nil {
		return 0, fmt.Errorf("outbox: retry %s now: %w", destination, err)
	}
	return n, nil
}

// shouldNotify reports whether this Enqueue sends NOTIFY.
func (o *Outbox) shouldNotify() bool {
	if o.cfg.DisableNotify {
		return false
	}
	if o.cfg.NotifyInterval <= 0 {
		return true
	}
	now := time.Now().UnixNano()
	last := o.lastNotify.Load()
	return now-last >= int64(o.cfg.NotifyInterval) && o.lastNotify.CompareAndSwap(last, now)
}

// Enqueue writes msgs in a transaction of its own on the Outbox's handle,
// for messages that go with no business write; see [Outbox.EnqueueTx].
func (o *Outbox) Enqueue(ctx context.Context, msgs ...Message) error {
	if len(msgs) == 0 {
		return nil
	}
	return pgx.BeginFunc(ctx, o.db, func(tx pgx.Tx) error { return o.EnqueueTx(ctx, tx, msgs...) })
}

// EnqueueTx inserts msgs into the outbox inside the caller's tx, so that
// they are published if and only if tx commits (a rollback discards
// them), and wakes the relays with one
// NOTIFY (delivered at commit; Postgres folds the identical notifications
// of one transaction into one).
//
// Messages of one key are published in the order of the Enqueue calls and,
// within a call, in the order of msgs. Large calls are written with COPY.
//
// Every message is validated before anything is written: on an
// [ErrInvalidMessage] error tx is untouched and may still commit. EnqueueTx
// with no messages does nothing; a nil tx is an error.
//
// Config.Headers, if set, adds the headers of ctx (its trace context,
// say) to each message, unless the message already carries them.
//
// Two-phase commit: Postgres refuses PREPARE TRANSACTION in a transaction
// that ran NOTIFY, so an Outbox whose EnqueueTx runs in transactions that
// are prepared needs [Config.DisableNotify]. The relay then finds their
// rows by polling, and keeps a prepared transaction's rows in their place
// in their keys' order until COMMIT PREPARED (or drops them at ROLLBACK
// PREPARED).
func (o *Outbox) EnqueueTx(ctx context.Context, tx pgx.Tx, msgs ...Message) error {
	if len(msgs) == 0 {
		return nil
	}
	if nilcheck.IsNil(tx) {
		return idemq.NewConfigError("outbox", "tx", "is nil: EnqueueTx needs the business transaction; use Enqueue for a transaction of its own")
	}
	msgs = withHeaders(ctx, o.cfg.Headers, msgs)
	rows, err := o.prepare(msgs)
	if err != nil {
		return err
	}
	if len(msgs) >= copyThreshold {
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{o.table.Schema, o.table.Name},
			outboxsql.Columns, pgx.CopyFromSlice(len(rows.ids), rows.copyRow)); err != nil {
			return dbError("enqueue", err)
		}
		if o.shouldNotify() {
			if _, err := tx.Exec(ctx, o.q.Notify, o.cfg.Channel); err != nil {
				return fmt.Errorf("outbox: notify: %w", err)
			}
		}
		return nil
	}
	b := &pgx.Batch{}
	b.Queue(o.q.Insert, rows.ids, rows.destinations, rows.keys, rows.payloads, rows.headers)
	if o.shouldNotify() {
		b.Queue(o.q.Notify, o.cfg.Channel)
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return dbError("enqueue", err)
	}
	return nil
}

type columns struct {
	ids          []uuid.UUID
	destinations []string
	keys         []*string
	payloads     [][]byte
	headers      []*string
}

func (c *columns) copyRow(i int) ([]any, error) {
	var key, headers any
	if c.keys[i] != nil {
		key = *c.keys[i]
	}
	if c.headers[i] != nil {
		headers = *c.headers[i]
	}
	return []any{c.ids[i], c.destinations[i], key, c.payloads[i], headers}, nil
}

// prepare validates msgs and lays them out as columns.
func (o *Outbox) prepare(msgs []Message) (*columns, error) {
	c := &columns{
		ids:          make([]uuid.UUID, len(msgs)),
		destinations: make([]string, len(msgs)),
		keys:         make([]*string, len(msgs)),
		payloads:     make([][]byte, len(msgs)),
		headers:      make([]*string, len(msgs)),
	}
	for i := range msgs {
		m := &msgs[i]
		bad := func(field, reason string, err error) error {
			return &InvalidMessageError{Index: i, Field: field, Reason: reason, err: err}
		}
		switch {
		case m.Destination == "":
			return nil, bad("destination", "empty", nil)
		case len(m.Destination) > MaxDestinationLen:
			return nil, bad("destination", fmt.Sprintf("%d bytes, limit %d", len(m.Destination), MaxDestinationLen), nil)
		case !cleanText(m.Destination):
			return nil, bad("destination", "not UTF-8 or contains NUL", nil)
		case len(m.Key) > MaxKeyLen:
			return nil, bad("key", fmt.Sprintf("%d bytes, limit %d", len(m.Key), MaxKeyLen), nil)
		case !cleanText(m.Key):
			return nil, bad("key", "not UTF-8 or contains NUL", nil)
		case len(m.Payload) > o.cfg.MaxPayload:
			return nil, bad("payload", fmt.Sprintf("%d bytes, limit %d", len(m.Payload), o.cfg.MaxPayload), ErrPayloadTooLarge)
		}
		if len(m.Headers) > 0 {
			for name, value := range m.Headers {
				if !isToken(name) {
					return nil, bad("headers", fmt.Sprintf("invalid name %q: want an HTTP token", name), nil)
				}
				if !cleanText(value) || strings.ContainsAny(value, "\r\n") {
					return nil, bad("headers", fmt.Sprintf("invalid value for %q: want UTF-8 without NUL, CR or LF", name), nil)
				}
			}
			js, err := json.Marshal(m.Headers)
			if err != nil {
				return nil, bad("headers", err.Error(), nil)
			}
			if len(js) > MaxHeadersLen {
				return nil, bad("headers", fmt.Sprintf("%d bytes as JSON, limit %d", len(js), MaxHeadersLen), nil)
			}
			s := string(js)
			c.headers[i] = &s
		}
		c.ids[i] = m.ID
		if m.ID == uuid.Nil {
			id, err := uuid.NewV7()
			if err != nil {
				return nil, fmt.Errorf("outbox: new id: %w", err)
			}
			c.ids[i] = id
		}
		c.destinations[i] = m.Destination
		if m.Key != "" {
			c.keys[i] = &m.Key
		}
		c.payloads[i] = m.Payload
		if m.Payload == nil {
			c.payloads[i] = []byte{}
		}
	}
	return c, nil
}

// cleanText reports whether s can be stored in a text column: valid UTF-8
// without NUL.
func cleanText(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}

// isToken reports whether s is an RFC 9110 token.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
