package outbox

import (
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

	"github.com/idemq/idemq/internal/pgutil"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Limits on the parts of a [Message] that are not configurable: they keep
// every row insertable (a btree entry holds at most about 2.7 kB) so that
// an oversized field is a clear error from [Outbox.Enqueue] instead of a
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
// [Outbox.Enqueue] returns for a message it refused before writing
// anything. The concrete error is an [*InvalidMessageError].
var ErrInvalidMessage = errors.New("outbox: invalid message")

// ErrPayloadTooLarge is matched, in addition to [ErrInvalidMessage], when a
// payload exceeds [Config.MaxPayload].
var ErrPayloadTooLarge = errors.New("payload too large")

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

// Message is one message to enqueue.
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

// Config configures an [Outbox]. The zero value is usable.
type Config struct {
	// Schema holds the tables. Defaults to "public".
	Schema string
	// Table is the outbox table; dead letters live in Table+"_dead".
	// Defaults to "idemq_outbox". Names are lower case letters, digits and
	// underscores, at most 48 bytes.
	Table string
	// MaxPayload is the largest payload in bytes Enqueue accepts.
	// Defaults to 1 MiB.
	MaxPayload int
	// Channel is the LISTEN/NOTIFY channel that wakes relays. Defaults to
	// the table name, prefixed with "<schema>." outside the public schema.
	Channel string
	// DisableNotify stops Enqueue from sending NOTIFY; relays then find new
	// rows by polling only.
	DisableNotify bool
	// NotifyInterval coalesces notifications across transactions: an
	// Enqueue sends NOTIFY only if no Enqueue of this Outbox sent one in the
	// last NotifyInterval. A NOTIFY makes its transaction's commit take a
	// cluster-wide lock until the commit is flushed, so notifying writers
	// lose group commit: 16 concurrent writers notifying every transaction
	// commit about a third as many transactions per second (see the relay
	// benchmarks). Relays poll every NotifyInterval for a while after each
	// wake-up, which finds the rows of the transactions that skipped their
	// NOTIFY. The one case that waits for the relay's PollInterval: the
	// transaction that did notify rolled back and no other transaction
	// notified after it. Defaults to 5 ms; a negative value notifies in
	// every transaction.
	NotifyInterval time.Duration
}

// Outbox writes messages inside the caller's transaction and manages the
// dead letters. It is safe for concurrent use.
type Outbox struct {
	table      pgutil.Table
	maxPayload int
	channel    string
	notify     bool
	lockClass  int32
	every      time.Duration
	lastNotify atomic.Int64 // unix nanoseconds of the last NOTIFY sent

	insertSQL string
}

// New validates cfg and returns an Outbox. It does not touch the database;
// call [Outbox.Migrate] once to create the tables.
func New(cfg Config) (*Outbox, error) {
	if cfg.Schema == "" {
		cfg.Schema = "public"
	}
	if cfg.Table == "" {
		cfg.Table = "idemq_outbox"
	}
	t, err := pgutil.NewTable(cfg.Schema, cfg.Table)
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	if cfg.MaxPayload < 0 {
		return nil, fmt.Errorf("outbox: MaxPayload %d is negative", cfg.MaxPayload)
	}
	if cfg.MaxPayload == 0 {
		cfg.MaxPayload = 1 << 20
	}
	if cfg.Channel == "" {
		cfg.Channel = cfg.Table
		if cfg.Schema != "public" {
			cfg.Channel = cfg.Schema + "." + cfg.Table
		}
	}
	if len(cfg.Channel) > 63 || strings.IndexByte(cfg.Channel, 0) >= 0 || !utf8.ValidString(cfg.Channel) {
		return nil, fmt.Errorf("outbox: invalid channel %q: want at most 63 bytes of UTF-8 without NUL", cfg.Channel)
	}
	if cfg.NotifyInterval == 0 {
		cfg.NotifyInterval = 5 * time.Millisecond
	}
	h := fnv.New32a()
	h.Write([]byte("idemq-outbox:" + cfg.Schema + "." + cfg.Table))
	return &Outbox{
		table:      t,
		maxPayload: cfg.MaxPayload,
		channel:    cfg.Channel,
		notify:     !cfg.DisableNotify,
		lockClass:  int32(h.Sum32()),
		every:      max(cfg.NotifyInterval, 0),
		insertSQL: `INSERT INTO ` + t.String() + ` (id, destination, key, payload, headers)
SELECT m.id, m.destination, m.key, m.payload, m.headers::jsonb
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::bytea[], $5::text[])
     WITH ORDINALITY AS m(id, destination, key, payload, headers, n)
ORDER BY m.n`,
	}, nil
}

// Migrate creates or upgrades the outbox and dead-letter tables. It is
// safe to run from several processes at once.
func (o *Outbox) Migrate(ctx context.Context, db DB) error {
	return pgutil.Migrate(ctx, db, migrations, "migrations", "outbox", o.table)
}

// DB is what the outbox needs from a database handle: a *pgxpool.Pool, a
// *pgx.Conn and a pgx.Tx all satisfy it.
type DB = pgutil.DB

// Table returns the quoted, schema-qualified outbox table, for the relay
// and for tools.
func (o *Outbox) Table() string { return o.table.String() }

// DeadTable returns the quoted, schema-qualified dead-letter table.
func (o *Outbox) DeadTable() string { return o.table.Ident("_dead") }

// Channel returns the LISTEN/NOTIFY channel relays listen on.
func (o *Outbox) Channel() string { return o.channel }

// NotifyInterval returns the interval within which Enqueue sends at most
// one NOTIFY (see [Config.NotifyInterval]); 0 when every transaction
// notifies. Relays poll at this interval for a while after a wake-up.
func (o *Outbox) NotifyInterval() time.Duration { return o.every }

// shouldNotify reports whether this Enqueue sends NOTIFY.
func (o *Outbox) shouldNotify() bool {
	if !o.notify {
		return false
	}
	if o.every == 0 {
		return true
	}
	now := time.Now().UnixNano()
	last := o.lastNotify.Load()
	return now-last >= int64(o.every) && o.lastNotify.CompareAndSwap(last, now)
}

// LockClass returns the first key of the transaction-scoped advisory locks
// (class, hashtext(key)) that serialise everyone who claims or moves rows
// of one ordering key. Relays and the dead-letter calls take them.
func (o *Outbox) LockClass() int32 { return o.lockClass }

// Enqueue inserts msgs into the outbox inside tx, so that they are
// published if and only if tx commits, and wakes the relays with one
// NOTIFY (delivered at commit; Postgres folds the identical notifications
// of one transaction into one).
//
// Messages of one key are published in the order of the Enqueue calls and,
// within a call, in the order of msgs. Large calls are written with COPY.
//
// Every message is validated before anything is written: on an
// [ErrInvalidMessage] error tx is untouched and may still commit. Enqueue
// with no messages does nothing.
func (o *Outbox) Enqueue(ctx context.Context, tx pgx.Tx, msgs ...Message) error {
	if len(msgs) == 0 {
		return nil
	}
	rows, err := o.prepare(msgs)
	if err != nil {
		return err
	}
	if len(msgs) >= copyThreshold {
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{o.table.Schema, o.table.Name},
			[]string{"id", "destination", "key", "payload", "headers"}, pgx.CopyFromSlice(len(rows.ids), rows.copyRow)); err != nil {
			return fmt.Errorf("outbox: enqueue: %w", err)
		}
		if o.shouldNotify() {
			if _, err := tx.Exec(ctx, `SELECT pg_notify($1, '')`, o.channel); err != nil {
				return fmt.Errorf("outbox: notify: %w", err)
			}
		}
		return nil
	}
	b := &pgx.Batch{}
	b.Queue(o.insertSQL, rows.ids, rows.destinations, rows.keys, rows.payloads, rows.headers)
	if o.shouldNotify() {
		b.Queue(`SELECT pg_notify($1, '')`, o.channel)
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("outbox: enqueue: %w", err)
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
		case len(m.Payload) > o.maxPayload:
			return nil, bad("payload", fmt.Sprintf("%d bytes, limit %d", len(m.Payload), o.maxPayload), ErrPayloadTooLarge)
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
