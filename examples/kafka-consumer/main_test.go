package main

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/idemq/idemq/testenv"
)

// TestExample runs the example on a fresh database: every payment booked
// once, the re-sends duplicates, the reused id a conflict.
func TestExample(t *testing.T) {
	pool, err := openPool(t.Context(), testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	testenv.RunProgram(t, 2*time.Minute, func(ctx context.Context, out io.Writer) error { return run(ctx, pool, out) },
		"30 applied, 8 duplicates, 1 conflicts", "ledger: 30 rows for 30 payments", "ok:")
}
