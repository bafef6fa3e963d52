package endpoints_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportsNoDeliveryMachinery: managing endpoints and publishing to
// them (a producing service, `idemq webhook`, the console, which reads the
// registry) compiles neither the relay nor the consumer nor the Sink's
// HTTP client and SSRF guard (issue 28 §2).
func TestImportsNoDeliveryMachinery(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "github.com/idemq/idemq/transports/webhook/endpoints", "github.com/idemq/idemq/console").CombinedOutput()
	if err != nil {
		t.Fatalf("go list (the go command must be on PATH): %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "github.com/idemq/idemq/outbox\n") {
		t.Fatalf("go list did not list the outbox:\n%s", out)
	}
	for _, dep := range strings.Fields(string(out)) {
		switch dep {
		case "github.com/idemq/idemq/relay", "github.com/idemq/idemq/consumer", "github.com/idemq/idemq/transports/webhook",
			"code.dny.dev/ssrf", "golang.org/x/time/rate":
			t.Errorf("endpoints or the console depends on %s", dep)
		}
	}
}
