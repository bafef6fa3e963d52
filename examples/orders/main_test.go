package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/testenv"
)

// TestMain runs the relay child process when the demo's test re-executes
// this binary as one.
func TestMain(m *testing.M) {
	if spec := os.Getenv(relayChildEnv); spec != "" {
		fmt.Fprintln(os.Stderr, "relay child:", relayChild(spec))
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// TestDemo runs the demo's main path with fewer orders on a fresh database:
// every count in its table must match.
func TestDemo(t *testing.T) {
	connString := testenv.PostgresURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, &out, 60, connString); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	// The progress lines come first, with their counts.
	for _, want := range []string{"placing 60 orders", "requests answered: 60 orders created", "relay child killed after publishing",
		"billing consumer done: 60 charges", "shipping consumer done: 60 shipments", "partner applied 60 webhooks",
		"charges", "shipments", "webhooks applied", "refused with 422"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q line in\n%s", want, out.String())
		}
	}
	t.Log("\n" + out.String())
}
