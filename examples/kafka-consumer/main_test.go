package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestExample runs the example: every payment booked once, the re-sends
// duplicates, the reused id a conflict.
func TestExample(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{"30 applied, 8 duplicates, 1 conflicts", "ledger: 30 rows for 30 payments", "ok:"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in\n%s", want, out.String())
		}
	}
	t.Log("\n" + out.String())
}
