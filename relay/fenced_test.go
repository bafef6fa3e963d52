package relay

import (
	"errors"
	"fmt"
	"testing"

	"github.com/idemq/idemq"
)

// TestFencedIsLeaseLost: a fenced-off batch speaks the one lease vocabulary.
func TestFencedIsLeaseLost(t *testing.T) {
	err := fmt.Errorf("%w: no heartbeat for LeaseTTL", errFenced)
	if !errors.Is(err, idemq.ErrLeaseLost) {
		t.Fatalf("errors.Is(%v, idemq.ErrLeaseLost) = false", err)
	}
}
