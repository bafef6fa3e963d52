package main

import (
	"testing"
	"time"

	"github.com/idemq/idemq/testenv"
)

// TestExample runs the example: every retry answered with the first
// response, the reused key 422, the missing key 400, each payment booked once.
func TestExample(t *testing.T) {
	testenv.RunProgram(t, 2*time.Minute, run, "answers: 20 created, 9 replayed", "1 × 422, 1 × 400", "payments table: 20 rows", "ok:")
}
