// Package docs holds the user guides; its test keeps the README's
// quickstart true by running it as a user would.
package docs

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

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
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	goMod := "module quickstart\n\ngo 1.26\n\nrequire github.com/idemq/idemq v0.0.0\n\nreplace github.com/idemq/idemq => " + root + "\n"
	goSum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string][]byte{"main.go": m[1], "go.mod": []byte(goMod), "go.sum": goSum} {
		if err := os.WriteFile(filepath.Join(dir, name), content, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	connString, drop, err := testenv.CreateDatabase(ctx, "idemq_quickstart")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = drop() })
	run := func(env []string, name string, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run(nil, "go", "mod", "tidy")
	out := run([]string{"DATABASE_URL=" + connString}, "go", "run", ".")
	for _, want := range []string{"201 Created replayed: false", "201 Created replayed: true", `billing applied {"total":42} once`} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in the quickstart's output:\n%s", want, out)
		}
	}
}
