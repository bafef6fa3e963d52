package main

import (
	"testing"
	"time"

	"github.com/idemq/idemq/testenv"
)

// TestExample runs the example: the re-published messages are dropped by
// the stream, which holds every order once, in order per customer.
func TestExample(t *testing.T) {
	testenv.RunProgram(t, 2*time.Minute, run, "placed 60 orders", "stream holds 60 messages", "order kept for every customer: true", "ok:")
}
