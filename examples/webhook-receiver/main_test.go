package main

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/idemq/idemq/testenv"
)

// TestExample runs the example on a fresh database: duplicates answered
// 200 without a second row, the forgery 401, the reused id 409.
func TestExample(t *testing.T) {
	pool, err := openPool(t.Context(), testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	testenv.RunProgram(t, 2*time.Minute, func(ctx context.Context, out io.Writer) error { return run(ctx, pool, out) },
		"31 × 200, 1 × 401, 1 × 409", "shipments: 25 rows for 25 webhooks", "ok:")
}
