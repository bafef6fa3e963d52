package consumer

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/internal/inboxsql"
)

// Message is one delivery from a transport.
type Message struct {
	// ID is the producer's message id, the idempotency key unless
	// Config.KeyFunc derives another.
	ID      string
	Payload []byte
	Headers map[string]string
	// Delivery is the transport's 1-based delivery count when it keeps one
	// (JetStream's NumDelivered), 0 otherwise.
	Delivery int
	// Source is the transport's own message (a kafka.Message, a
	// jetstream.Msg, ...), for handlers that need more than the above.
	Source any
}

// Handler applies a message inside tx, the transaction that also records it
// in the inbox: its writes commit if and only if the message is recorded as
// applied. It must not commit or roll back tx; returning an error rolls
// back. Wrap the error with idemq.Permanent to dead-letter the message at once,
// or with idemq.RetryAfter to delay the retry.
type Handler func(ctx context.Context, tx pgx.Tx, msg *Message) error

// LeasedHandler applies a message whose effects live outside Postgres (an
// HTTP call, an email) while the consumer holds a lease on its key. Pass
// lease.Key and lease.Token downstream so the far side can deduplicate and
// reject a stale writer. ctx is cancelled if the lease is lost.
type LeasedHandler func(ctx context.Context, msg *Message, lease idemq.Lease) error

// DeadLetterFunc is called when a message becomes a dead letter or a
// conflict, inside the transaction that records it, so it can enqueue the
// message elsewhere (an outbox row to a dead-letter topic) atomically. An
// error makes the message's outcome Retry.
type DeadLetterFunc func(ctx context.Context, tx pgx.Tx, msg *Message, cause error) error

// Hooks are optional callbacks for metrics. They run synchronously: keep
// them fast. Each takes an event struct, so fields can be added later
// without breaking a hook.
type Hooks struct {
	// OnResult is called once per message with its final result: the
	// outcome counts applied, duplicates, conflicts, retries and dead
	// letters; Duration is the latency.
	OnResult func(ResultEvent)
	// OnRetried is called for each failed attempt retried in process,
	// before the wait: the name and the moment of relay.Hooks.OnRetried,
	// for a failed message put back for another attempt.
	OnRetried func(RetriedEvent)
}

// ResultEvent reports the result of one message to [Hooks.OnResult].
type ResultEvent struct {
	// Scope is the consumer's scope.
	Scope string
	Result
}

// RetriedEvent reports a failed attempt about to be retried in process to
// [Hooks.OnRetried].
type RetriedEvent struct {
	// Scope is the consumer's scope; Key the message's idempotency key.
	Scope, Key string
	// Attempt counts the failed attempts so far, as recorded in the inbox.
	Attempt int
	// Err is the handler's error.
	Err error
	// Delay is the wait before the next attempt.
	Delay time.Duration
}

// The defaults of [Config].
var (
	// RetryDefault is the retry policy of a zero Config.Retry: 5 attempts,
	// backoff from 100 ms up to 10 s, at most 1 minute in place.
	RetryDefault = idemq.Retry{MaxAttempts: 5, BaseDelay: 100 * time.Millisecond, MaxDelay: 10 * time.Second, MaxElapsed: time.Minute}
)

const (
	// LeaseTTLDefault is the lease duration of a zero Config.LeaseTTL.
	LeaseTTLDefault = 30 * time.Second
	// LeaseTTLMin is the shortest lease accepted: the lease is extended
	// every third of it, and shorter periods are all overhead.
	LeaseTTLMin = 3 * time.Millisecond
	// RedeliverBackstop is the multiple of Retry.MaxAttempts that a
	// transport's delivery count (Message.Delivery) must exceed before a
	// Redeliver-mode message is dead-lettered without a recorded failure:
	// a far backstop for a message that kills its consumer every time.
	RedeliverBackstop = 10
)

// Config configures a Consumer. The zero value is valid; zero fields mean
// their documented defaults.
type Config struct {
	// KeyFunc derives the idempotency key, e.g. a business key from the
	// payload. Defaults to the message's ID. An error dead-letters the
	// message with ErrInvalidMessage.
	KeyFunc func(*Message) (string, error)
	// Fingerprint returns the digest a redelivery must match (at most 64
	// bytes). Defaults to the SHA-256 of the payload.
	Fingerprint func(*Message) []byte
	// Retry bounds and spaces the attempts at a message: after
	// Retry.MaxAttempts failed attempts (counted durably in the inbox,
	// across deliveries and processes) or Retry.MaxElapsed in place, it
	// becomes a dead letter. Only handler failures count: a crash, a lost
	// connection, a cancelled context or a database error never does.
	// Defaults to RetryDefault, field by field.
	Retry idemq.Retry
	// Redeliver hands retries to the transport: a retryable failure returns
	// Retry at once with RetryAfter set by the backoff policy. For
	// transports that redeliver with a delay (JetStream NakWithDelay).
	// Attempts are still counted in the inbox, never by the transport's
	// delivery count, which also counts deliveries to killed processes;
	// that count only dead-letters a message delivered more than
	// RedeliverBackstop × Retry.MaxAttempts times. Defaults to false:
	// retry in place, which keeps partition order.
	Redeliver bool
	// DeadLetter, if set, is called for every dead letter and conflict.
	DeadLetter DeadLetterFunc
	// LeaseTTL is the lease duration in leased mode; the consumer extends
	// the lease every third of it while the handler runs. At least
	// LeaseTTLMin. Defaults to 30 seconds.
	LeaseTTL time.Duration
	// Owner names this process in leases. Defaults to host name, process id
	// and a random suffix.
	Owner string
	// Logger receives one line per message outcome other than Applied and
	// Duplicate (those at Debug level); every line carries scope and key.
	// Defaults to slog.Default().
	Logger *slog.Logger
	// Hooks are metrics callbacks.
	Hooks Hooks
	// Inbox configures the inbox tables.
	Inbox inbox.Config
}

func (c Config) withDefaults() Config {
	if c.KeyFunc == nil {
		c.KeyFunc = func(m *Message) (string, error) { return m.ID, nil }
	}
	if c.Fingerprint == nil {
		c.Fingerprint = func(m *Message) []byte {
			sum := sha256.Sum256(m.Payload)
			return sum[:]
		}
	}
	c.Retry = c.Retry.WithDefaults(RetryDefault)
	c.LeaseTTL = cmp.Or(c.LeaseTTL, LeaseTTLDefault)
	if c.Owner == "" {
		c.Owner = defaultOwner()
	}
	c.Logger = cmp.Or(c.Logger, slog.Default())
	return c
}

func (c Config) validate() error {
	if err := c.Retry.Validate(component); err != nil {
		return err
	}
	if c.LeaseTTL < LeaseTTLMin {
		return idemq.NewConfigError(component, "LeaseTTL", "%v is below the minimum of %v", c.LeaseTTL, LeaseTTLMin)
	}
	return nil
}

// component names the consumer in configuration errors.
const component = "consumer"

func defaultOwner() string {
	host, _ := os.Hostname()
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(suffix))
}

// Consumer applies messages of one scope effectively once. It is safe for
// concurrent use.
type Consumer struct {
	pool    *pgxpool.Pool
	scope   string
	store   *inbox.Store    // setup, leases, administration
	claims  *inboxsql.Store // store itself, with the claim protocol
	handler Handler
	batch   BatchHandler // set by NewBatched; handler then calls it with one message
	leased  LeasedHandler
	cfg     Config
	tenants *tenants // set by NewRouted: each message goes to its tenant's consumer
}

// New returns a transactional Consumer: handler runs inside the transaction
// that records the message in the inbox under scope (the consumer's name;
// two consumers of one message each apply it once).
func New(pool *pgxpool.Pool, scope string, handler Handler, cfg Config) (*Consumer, error) {
	if handler == nil {
		return nil, idemq.NewConfigError(component, "handler", "is nil")
	}
	return newConsumer(pool, scope, cfg, func(c *Consumer) { c.handler = handler })
}

// NewLeased returns a leased Consumer, for effects outside Postgres: the
// key is held under a lease while handler runs and recorded as applied
// when it returns nil.
func NewLeased(pool *pgxpool.Pool, scope string, handler LeasedHandler, cfg Config) (*Consumer, error) {
	if handler == nil {
		return nil, idemq.NewConfigError(component, "handler", "is nil")
	}
	return newConsumer(pool, scope, cfg, func(c *Consumer) { c.leased = handler })
}

func newConsumer(pool *pgxpool.Pool, scope string, cfg Config, set func(*Consumer)) (*Consumer, error) {
	if pool == nil {
		return nil, idemq.NewConfigError(component, "pool", "is nil")
	}
	if scope == "" || len(scope) > maxScope {
		return nil, idemq.NewConfigError(component, "scope", "must be 1 to %d bytes, got %d", maxScope, len(scope))
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	store, err := inbox.New(pool, cfg.Inbox)
	if err != nil {
		return nil, err
	}
	// The Store is the claim protocol's handle under its public name.
	c := &Consumer{pool: pool, scope: scope, store: store, claims: (*inboxsql.Store)(store), cfg: cfg}
	set(c)
	return c, nil
}

// Migrate creates or upgrades the inbox tables; see [inbox.Store.Migrate].
// A routed consumer ([NewRouted]) migrates the inbox of every database
// its Source lists, and reports each failure.
func (c *Consumer) Migrate(ctx context.Context) error {
	if c.tenants != nil {
		return c.tenants.migrate(ctx, c)
	}
	return c.store.Migrate(ctx)
}

// Maintenance returns the service that keeps the consumer's inbox in
// shape, its [inbox.Store.Chores] (GC, partitions, dead-letter classes),
// with the extra chores of other stores on the same database
// (outbox.Outbox.Chores, pgstore.Store.Chores), logged through
// Config.Logger. Start it with idemq.Start beside the consumer, in every
// process that runs one: each chore runs in one process at a time. A
// partitioned inbox needs it, or GC on a schedule of its own, at least
// once per PartitionInterval.
func (c *Consumer) Maintenance(extra ...idemq.Chore) (*idemq.Maintenance, error) {
	return idemq.NewMaintenance(c.cfg.Logger, append(c.store.Chores(), extra...)...)
}

// Scope returns the consumer's dedupe scope.
func (c *Consumer) Scope() string { return c.scope }

// Store returns the inbox the consumer records messages in, for GC,
// inspection, and managing its dead letters and conflicts; nil for a
// routed consumer (see [Consumer.Tenant]).
func (c *Consumer) Store() *inbox.Store { return c.store }

// ValidKey reports whether key is usable as an idempotency key by this
// consumer's inbox (non-empty, within Inbox.MaxKeyLen bytes, valid UTF-8
// without NUL), so a transport can fall back to another id before the
// message reaches [Consumer.Process].
func (c *Consumer) ValidKey(key string) error { return c.claims.Validate(key, nil) }

// maxScope bounds a scope name, as the inbox's scopes table does.
const maxScope = 200

// The headers every transport sets on the copy of a message it sends to a
// dead-letter destination.
const (
	// HeaderDeadLetterReason carries the error that made the message a
	// dead letter or a conflict, cut to a bounded length.
	HeaderDeadLetterReason = "Idemq-Dead-Letter-Reason"
	// HeaderDeadLetterOutcome is the Outcome's text: "dead-lettered" or
	// "conflict".
	HeaderDeadLetterOutcome = "Idemq-Dead-Letter-Outcome"
	// HeaderDeadLetterSource names where the message came from (a Kafka
	// topic/partition/offset, a NATS subject and sequence).
	HeaderDeadLetterSource = "Idemq-Dead-Letter-Source"
)

var (
	// ErrInvalidMessage reports a message that cannot be processed at all:
	// nil, nil payload, or a key that is empty, too long or not text. It is
	// dead-lettered without an inbox record, since it has no usable key.
	ErrInvalidMessage = errors.New("consumer: invalid message")
	// ErrDeadLetter reports a redelivery of a message that is already a
	// dead letter; it is not applied again.
	ErrDeadLetter = errors.New("consumer: message is a dead letter")
	// ErrTooManyDeliveries dead-letters a Redeliver-mode message delivered
	// more than RedeliverBackstop × Retry.MaxAttempts times.
	ErrTooManyDeliveries = errors.New("consumer: delivered too many times")
	// ErrInProgress reports a message whose key a leased worker holds; the
	// transport should redeliver it after Result.RetryAfter.
	ErrInProgress = errors.New("consumer: message is in progress elsewhere")
)
