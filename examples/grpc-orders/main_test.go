package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/testenv"
)

// TestExampleCreatesOneOrderPerCall runs the example on a fresh database:
// every lost reply is answered from the record on retry.
func TestExampleCreatesOneOrderPerCall(t *testing.T) {
	pool, err := openPool(t.Context(), testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, pool, &out); err != nil {
		t.Fatalf("grpc-orders: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "replayed responses: 6") {
		t.Errorf("want six replays (every third of 20 calls) in\n%s", out.String())
	}
	t.Log("\n" + out.String())
}
