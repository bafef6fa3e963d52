package console_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportsNeitherRelayNorConsumer: the console reads and changes the
// stores; it compiles neither the relay nor the consumer nor a webhook
// delivery client (issue 28 §2).
func TestImportsNeitherRelayNorConsumer(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "github.com/idemq/idemq/console").CombinedOutput()
	if err != nil {
		t.Fatalf("go list (the go command must be on PATH): %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "github.com/idemq/idemq/transports/webhook/endpoints\n") {
		t.Fatalf("go list did not list the webhook endpoints:\n%s", out)
	}
	for _, dep := range strings.Fields(string(out)) {
		switch dep {
		case "github.com/idemq/idemq/relay", "github.com/idemq/idemq/consumer", "github.com/idemq/idemq/transports/webhook":
			t.Errorf("the console depends on %s", dep)
		}
	}
}
