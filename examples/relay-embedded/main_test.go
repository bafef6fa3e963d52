package main

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/idemq/idemq/testenv"
)

// TestExample runs the example on a fresh database: the re-published
// messages are dropped by the stream, which holds every order once, in
// order per customer.
func TestExample(t *testing.T) {
	pool, err := openPool(t.Context(), testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	testenv.RunProgram(t, 2*time.Minute, func(ctx context.Context, out io.Writer) error { return run(ctx, pool, out) },
		"placed 60 orders", "stream holds 60 messages", "order kept for every customer: true", "ok:")
}
