// Package docs holds the user guides; its test keeps the README's
// quickstart true by running it as a user would.
package docs

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/idemq/idemq/testenv"
)

// quickstartBlock is the first Go block after the README's Quickstart
// heading.
var quickstartBlock = regexp.MustCompile("(?s)\n## Quickstart\n.*?```go\n(.*?)```")

// TestQuickstart copies the README's quickstart into a new module that
// requires idemq (replaced by this checkout) and runs it against a fresh
// database, as a user who pasted it would.
func TestQuickstart(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := quickstartBlock.FindSubmatch(readme)
	if m == nil {
		t.Fatal("README.md: no Go block under a '## Quickstart' heading")
	}
	out := testenv.RunModule(t, "..", "quickstart", map[string][]byte{"main.go": m[1]})
	for _, want := range []string{"201 Created replayed: false", "201 Created replayed: true", `billing applied {"total":42} once`} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in the quickstart's output:\n%s", want, out)
		}
	}
}
