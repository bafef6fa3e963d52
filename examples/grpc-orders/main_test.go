package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

func TestExampleCreatesOneOrderPerCall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, &out); err != nil {
		t.Fatalf("grpc-orders: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "replayed responses: 6") {
		t.Errorf("want six replays (every third of 20 calls) in\n%s", out.String())
	}
	t.Log("\n" + out.String())
}
