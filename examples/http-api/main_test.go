package main

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/idemq/idemq/testenv"
)

// TestExample runs the example on a fresh database: every retry answered
// with the first response, the reused key 422, the missing key 400, each
// payment booked once.
func TestExample(t *testing.T) {
	pool, err := openPool(t.Context(), testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	testenv.RunProgram(t, 2*time.Minute, func(ctx context.Context, out io.Writer) error { return run(ctx, pool, out) },
		"answers: 20 created, 9 replayed", "1 × 422, 1 × 400", "payments table: 20 rows", "ok:")
}
