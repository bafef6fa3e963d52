package main

import (
	"testing"
	"time"

	"github.com/idemq/idemq/testenv"
)

// TestExample runs the example: duplicates answered 200 without a second
// row, the forgery 401, the reused id 409.
func TestExample(t *testing.T) {
	testenv.RunProgram(t, 2*time.Minute, run, "31 × 200, 1 × 401, 1 × 409", "shipments: 25 rows for 25 webhooks", "ok:")
}
