package consumer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/inbox"
)

// Bad configuration is an error naming the field, never a panic later: a
// LeaseTTL of a few nanoseconds made the lease ticker panic in Process.
func TestNewRejectsInvalidConfig(t *testing.T) {
	pool, err := pgxpool.New(context.Background(), "postgres://127.0.0.1:1/none") // never connects
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	handler := func(context.Context, pgx.Tx, *consumer.Message) error { return nil }
	leased := func(context.Context, *consumer.Message, idemq.Lease) error { return nil }
	for _, tc := range []struct {
		field string
		new   func() (*consumer.Consumer, error)
	}{
		{"pool", func() (*consumer.Consumer, error) { return consumer.New(nil, "s", handler, consumer.Config{}) }},
		{"scope", func() (*consumer.Consumer, error) { return consumer.New(pool, "", handler, consumer.Config{}) }},
		{"handler", func() (*consumer.Consumer, error) { return consumer.New(pool, "s", nil, consumer.Config{}) }},
		{"handler", func() (*consumer.Consumer, error) { return consumer.NewLeased(pool, "s", nil, consumer.Config{}) }},
		{"Retry.MaxAttempts", func() (*consumer.Consumer, error) {
			return consumer.New(pool, "s", handler, consumer.Config{Retry: idemq.Retry{MaxAttempts: -1}})
		}},
		{"Retry.BaseDelay", func() (*consumer.Consumer, error) {
			return consumer.New(pool, "s", handler, consumer.Config{Retry: idemq.Retry{BaseDelay: time.Hour}})
		}},
		{"LeaseTTL", func() (*consumer.Consumer, error) {
			return consumer.NewLeased(pool, "s", leased, consumer.Config{LeaseTTL: 2 * time.Nanosecond})
		}},
		{"LeaseTTL", func() (*consumer.Consumer, error) {
			return consumer.NewLeased(pool, "s", leased, consumer.Config{LeaseTTL: -time.Second})
		}},
		{"MaxKeyLen", func() (*consumer.Consumer, error) {
			return consumer.New(pool, "s", handler, consumer.Config{Inbox: inbox.Config{MaxKeyLen: -1}})
		}},
	} {
		c, err := tc.new()
		var ce *idemq.ConfigError
		if c != nil || !errors.Is(err, idemq.ErrConfig) || !errors.As(err, &ce) || ce.Field != tc.field {
			t.Errorf("%s: New = %v, %v; want a ConfigError for the field", tc.field, c, err)
		}
	}
}

// A leased consumer with the shortest lease runs, extending it, without
// panicking.
func TestShortestLeaseRuns(t *testing.T) {
	pool := setup(t)
	c, err := consumer.NewLeased(pool, "mailer", func(ctx context.Context, m *consumer.Message, lease idemq.Lease) error {
		time.Sleep(5 * consumer.LeaseTTLMin) // several extensions
		return nil
	}, consumer.Config{LeaseTTL: consumer.LeaseTTLMin})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r := c.Process(context.Background(), msg("k", "p")); r.Outcome == 0 {
		t.Fatalf("result %+v", r)
	}
}
