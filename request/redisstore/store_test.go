package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/request/redisstore"
	"github.com/idemq/idemq/request/requesttest"
	"github.com/idemq/idemq/testenv"
)

func TestConformance(t *testing.T) {
	t.Run("autopipelined", func(t *testing.T) { conformance(t, false) })
	t.Run("NoAutoPipeline", func(t *testing.T) { conformance(t, true) })
}

func conformance(t *testing.T, noAutoPipeline bool) {
	requesttest.Run(t, requesttest.Harness{
		New: func(t *testing.T, ttl time.Duration) request.Store {
			rdb, prefix := testenv.Redis(t)
			s, err := redisstore.New(context.Background(), rdb, redisstore.Config{Prefix: prefix, RecordTTL: ttl, NoAutoPipeline: noAutoPipeline})
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	})
}

// TestEvictionCheck: a server that may evict records is refused unless the
// check is skipped.
func TestEvictionCheck(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	rdb := srv.Client()
	ctx := context.Background()
	if _, err := redisstore.New(ctx, rdb, redisstore.Config{}); err != nil {
		t.Fatalf("default server (no maxmemory): %v", err)
	}
	if err := rdb.ConfigSet(ctx, "maxmemory", "100mb").Err(); err != nil {
		t.Fatal(err)
	}
	for _, policy := range []string{"allkeys-lru", "volatile-lru", "volatile-ttl"} {
		if err := rdb.ConfigSet(ctx, "maxmemory-policy", policy).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := redisstore.New(ctx, rdb, redisstore.Config{}); !errors.Is(err, idemq.ErrConfig) {
			t.Fatalf("maxmemory-policy %s: %v, want ErrConfig", policy, err)
		}
		if _, err := redisstore.New(ctx, rdb, redisstore.Config{SkipEvictionCheck: true}); err != nil {
			t.Fatalf("maxmemory-policy %s with SkipEvictionCheck: %v", policy, err)
		}
	}
	if err := rdb.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := redisstore.New(ctx, rdb, redisstore.Config{}); err != nil {
		t.Fatalf("noeviction: %v", err)
	}
	if _, err := redisstore.New(ctx, rdb, redisstore.Config{Prefix: "a{b"}); !errors.Is(err, idemq.ErrConfig) {
		t.Fatalf("prefix with a brace: %v, want ErrConfig", err)
	}
}
