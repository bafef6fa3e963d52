package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestExample runs the example: every retry answered with the first
// response, the reused key 422, the missing key 400, each payment booked once.
func TestExample(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{"answers: 20 created, 9 replayed", "1 × 422, 1 × 400", "payments table: 20 rows", "ok:"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in\n%s", want, out.String())
		}
	}
	t.Log("\n" + out.String())
}
