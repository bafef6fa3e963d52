package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestExample runs the example: the re-published messages are dropped by
// the stream, which holds every order once, in order per customer.
func TestExample(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{"placed 60 orders", "stream holds 60 messages", "order kept for every customer: true", "ok:"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in\n%s", want, out.String())
		}
	}
	t.Log("\n" + out.String())
}
