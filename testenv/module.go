package testenv

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// RunModule writes files into a new module named name that requires idemq,
// replaced by the checkout at root, then runs `go mod tidy` and `go run .`
// there with DATABASE_URL set to a fresh database, and returns the
// program's output. It is how a test proves that code a user copies out of
// this repository works as written; a failing command fails tb.
func RunModule(tb testing.TB, root, name string, files map[string][]byte) string {
	tb.Helper()
	root, err := filepath.Abs(root)
	if err != nil {
		tb.Fatal(err)
	}
	goSum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		tb.Fatal(err)
	}
	dir := tb.TempDir()
	goMod := "module " + name + "\n\ngo 1.26\n\nrequire github.com/idemq/idemq v0.0.0\n\nreplace github.com/idemq/idemq => " + root + "\n"
	files["go.mod"], files["go.sum"] = []byte(goMod), goSum
	for file, content := range files {
		if err := os.WriteFile(filepath.Join(dir, file), content, 0o644); err != nil {
			tb.Fatal(err)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	connString, drop, err := CreateDatabase(ctx, "idemq_"+name)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = drop() })
	run := func(env []string, args ...string) string {
		tb.Helper()
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			tb.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run(nil, "mod", "tidy")
	return run([]string{"DATABASE_URL=" + connString}, "run", ".")
}
