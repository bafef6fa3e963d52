package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

func TestDemoAppliesEveryMessageOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, &out); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "kafka") {
		t.Errorf("no kafka row in\n%s", out.String())
	}
	t.Log("\n" + out.String())
}
