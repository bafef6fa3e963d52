package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestExample runs the example: duplicates answered 200 without a second
// row, the forgery 401, the reused id 409.
func TestExample(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{"31 × 200, 1 × 401, 1 × 409", "shipments: 25 rows for 25 webhooks", "ok:"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in\n%s", want, out.String())
		}
	}
	t.Log("\n" + out.String())
}
