package redisstore_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/request/redisstore"
	"github.com/idemq/idemq/request/requesttest"
	"github.com/idemq/idemq/testenv"
)

// BenchmarkRecordSize reports the server memory per completed record (see
// requesttest.Fill), 20 000 records on a redis-server of its own: the
// growth of used_memory, which includes Redis's per-key overhead and the
// expiry entries.
func BenchmarkRecordSize(b *testing.B) {
	const n = 20_000
	srv := testenv.StartRedis(b)
	rdb := srv.Client()
	ctx := context.Background()
	s, err := redisstore.New(ctx, rdb, redisstore.Config{})
	if err != nil {
		b.Fatal(err)
	}
	before := usedMemory(b, rdb)
	requesttest.Fill(b, s, n)
	after := usedMemory(b, rdb)
	for b.Loop() {
	}
	b.ReportMetric(float64(after-before)/n, "B/record")
}

func usedMemory(b *testing.B, rdb *redis.Client) int64 {
	b.Helper()
	v, err := rdb.Do(context.Background(), "MEMORY", "STATS").Result()
	if err != nil {
		b.Fatal(err)
	}
	stats, ok := v.(map[any]any)
	if !ok {
		b.Fatalf("MEMORY STATS: %T", v)
	}
	used, _ := stats["total.allocated"].(int64)
	return used
}
