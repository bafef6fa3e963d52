package main

import (
	"testing"
	"time"

	"github.com/idemq/idemq/testenv"
)

// TestExample runs the example: every payment booked once, the re-sends
// duplicates, the reused id a conflict.
func TestExample(t *testing.T) {
	testenv.RunProgram(t, 2*time.Minute, run, "30 applied, 8 duplicates, 1 conflicts", "ledger: 30 rows for 30 payments", "ok:")
}
