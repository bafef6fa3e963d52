package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/request/redisstore"
	"github.com/idemq/idemq/testenv"
)

// The bad-input suite of the Redis request store (issue 23): each careless
// argument gets an idemq.ErrConfig naming it, never a panic on first use.

// TestBadInputConfig: a nil or typed-nil client, a Prefix with a brace
// (which would break the hash tag that keeps a record's keys in one slot)
// and a RecordTTL under Redis's millisecond are refused, naming the field;
// the smallest accepted values are accepted.
func TestBadInputConfig(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var (
		client  *redis.Client
		cluster *redis.ClusterClient
	)
	for name, rdb := range map[string]redis.UniversalClient{"nil": nil, "typed-nil *redis.Client": client, "typed-nil *redis.ClusterClient": cluster} {
		_, err := redisstore.New(ctx, rdb, redisstore.Config{})
		wantConfigError(t, "New("+name+")", err, "rdb")
	}
	rdb, prefix := testenv.Redis(t)
	for _, tc := range []struct {
		field string
		cfg   redisstore.Config
	}{
		{"Prefix", redisstore.Config{Prefix: prefix + "{tenant}"}},
		{"Prefix", redisstore.Config{Prefix: prefix + "}"}},
		{"RecordTTL", redisstore.Config{Prefix: prefix, RecordTTL: time.Nanosecond}},
		{"RecordTTL", redisstore.Config{Prefix: prefix, RecordTTL: 999 * time.Microsecond}},
		{"RecordTTL", redisstore.Config{Prefix: prefix, RecordTTL: -time.Hour}},
	} {
		_, err := redisstore.New(ctx, rdb, tc.cfg)
		wantConfigError(t, "New("+tc.field+")", err, tc.field)
	}
	if _, err := redisstore.New(ctx, rdb, redisstore.Config{Prefix: prefix, RecordTTL: time.Millisecond}); err != nil {
		t.Errorf("RecordTTL of 1ms: %v, want it accepted", err)
	}
}

// wantConfigError fails unless err is a redisstore idemq.ErrConfig naming
// field.
func wantConfigError(t *testing.T, what string, err error, field string) {
	t.Helper()
	ce, ok := errors.AsType[*idemq.ConfigError](err)
	if !ok || !errors.Is(err, idemq.ErrConfig) || ce.Field != field || ce.Component != "redisstore" {
		t.Errorf("%s: %v, want a redisstore idemq.ErrConfig naming %s", what, err, field)
	}
}
