package consumer

import (
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
	"github.com/idemq/idemq/internal/retry"
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
// back. Wrap the error with [Permanent] to dead-letter the message at once,
// or with idemq.RetryAfter to delay the retry.
type Handler func(ctx context.Context, tx pgx.Tx, msg *Message) error

// LeasedHandler applies a message whose effects live outside Postgres (an
// HTTP call, an email) while the consumer holds a lease on its key. Pass
// lease.Key and lease.Token downstream so the far side can deduplicate and
// reject a stale writer. ctx is cancelled if the lease is lost.
type LeasedHandler func(ctx context.Context, msg *Message, lease inbox.Lease) error

// DeadLetterFunc is called when a message becomes a dead letter or a
// conflict, inside the transaction that records it, so it can enqueue the
// message elsewhere (an outbox row to a dead-letter topic) atomically. An
// error makes the message's outcome Retry.
type DeadLetterFunc func(ctx context.Context, tx pgx.Tx, msg *Message, cause error) error

// Hooks are optional callbacks for metrics. They run synchronously: keep
// them fast.
type Hooks struct {
	// OnResult is called once per message with its final result: the
	// outcome counts applied, duplicates, conflicts, retries and dead
	// letters; Duration is the latency.
	OnResult func(scope string, r Result)
	// OnRetry is called before each in-process retry of a failed attempt.
	OnRetry func(scope, key string, attempt int, err error, delay time.Duration)
}

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
	// MaxAttempts bounds the attempts at a message before it becomes a dead
	// letter. Defaults to 5.
	MaxAttempts int
	// MaxElapsed bounds the time spent retrying one message in process.
	// Defaults to 1 minute.
	MaxElapsed time.Duration
	// BaseDelay and MaxDelay shape the exponential backoff with full jitter
	// between attempts. Default to 100 ms and 10 s.
	BaseDelay, MaxDelay time.Duration
	// Redeliver hands retries to the transport: a retryable failure returns
	// Retry at once with RetryAfter set by the backoff policy, and attempts
	// are counted by Message.Delivery (or, in leased mode, by the inbox).
	// For transports that redeliver with a delay (JetStream NakWithDelay).
	// Defaults to false: retry in place, which keeps partition order.
	Redeliver bool
	// DeadLetter, if set, is called for every dead letter and conflict.
	DeadLetter DeadLetterFunc
	// LeaseTTL is the lease duration in leased mode; the consumer extends
	// the lease while the handler runs. Defaults to 30 seconds.
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

func (c Config) withDefaults() (Config, error) {
	if c.MaxAttempts < 0 || c.MaxElapsed < 0 || c.BaseDelay < 0 || c.MaxDelay < 0 || c.LeaseTTL < 0 {
		return c, errors.New("consumer: attempts, delays and durations must not be negative")
	}
	if c.KeyFunc == nil {
		c.KeyFunc = func(m *Message) (string, error) { return m.ID, nil }
	}
	if c.Fingerprint == nil {
		c.Fingerprint = func(m *Message) []byte {
			sum := sha256.Sum256(m.Payload)
			return sum[:]
		}
	}
	c.MaxAttempts = orDefault(c.MaxAttempts, 5)
	c.MaxElapsed = orDefault(c.MaxElapsed, time.Minute)
	c.BaseDelay = orDefault(c.BaseDelay, 100*time.Millisecond)
	c.MaxDelay = orDefault(c.MaxDelay, 10*time.Second)
	c.LeaseTTL = orDefault(c.LeaseTTL, 30*time.Second)
	if c.BaseDelay > c.MaxDelay {
		return c, fmt.Errorf("consumer: BaseDelay %v exceeds MaxDelay %v", c.BaseDelay, c.MaxDelay)
	}
	if c.Owner == "" {
		c.Owner = defaultOwner()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

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
	store   *inbox.Store
	handler Handler
	leased  LeasedHandler
	cfg     Config
	policy  retry.Policy
}

// New returns a transactional Consumer: handler runs inside the transaction
// that records the message in the inbox under scope (the consumer's name;
// two consumers of one message each apply it once).
func New(pool *pgxpool.Pool, scope string, handler Handler, cfg Config) (*Consumer, error) {
	if handler == nil {
		return nil, errors.New("consumer: nil handler")
	}
	return newConsumer(pool, scope, cfg, func(c *Consumer) { c.handler = handler })
}

// NewLeased returns a leased Consumer, for effects outside Postgres: the
// key is held under a lease while handler runs and recorded as applied
// when it returns nil.
func NewLeased(pool *pgxpool.Pool, scope string, handler LeasedHandler, cfg Config) (*Consumer, error) {
	if handler == nil {
		return nil, errors.New("consumer: nil handler")
	}
	return newConsumer(pool, scope, cfg, func(c *Consumer) { c.leased = handler })
}

func newConsumer(pool *pgxpool.Pool, scope string, cfg Config, set func(*Consumer)) (*Consumer, error) {
	if pool == nil {
		return nil, errors.New("consumer: nil pool")
	}
	if scope == "" {
		return nil, errors.New("consumer: empty scope")
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	store, err := inbox.New(pool, cfg.Inbox)
	if err != nil {
		return nil, err
	}
	c := &Consumer{pool: pool, scope: scope, store: store, cfg: cfg,
		policy: retry.Policy{Base: cfg.BaseDelay, Cap: cfg.MaxDelay}}
	set(c)
	return c, nil
}

// Migrate creates or upgrades the inbox tables; see [inbox.Store.Migrate].
func (c *Consumer) Migrate(ctx context.Context) error { return c.store.Migrate(ctx) }

// Scope returns the consumer's dedupe scope.
func (c *Consumer) Scope() string { return c.scope }

// Store returns the inbox the consumer records messages in, for GC and
// inspection.
func (c *Consumer) Store() *inbox.Store { return c.store }

// Permanent marks a handler error as not worth retrying: the message
// becomes a dead letter at once. It is [idemq.Permanent].
func Permanent(err error) error { return idemq.Permanent(err) }

var (
	// ErrInvalidMessage reports a message that cannot be processed at all:
	// nil, nil payload, or a key that is empty, too long or not text. It is
	// dead-lettered without an inbox record, since it has no usable key.
	ErrInvalidMessage = errors.New("consumer: invalid message")
	// ErrDeadLetter reports a redelivery of a message that is already a
	// dead letter; it is not applied again.
	ErrDeadLetter = errors.New("consumer: message is a dead letter")
	// ErrInProgress reports a message whose key a leased worker holds; the
	// transport should redeliver it after Result.RetryAfter.
	ErrInProgress = errors.New("consumer: message is in progress elsewhere")
)
