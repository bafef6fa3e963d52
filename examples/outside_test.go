// Package examples holds programs a user copies into a module of their
// own; its tests prove that such a copy works outside this repository.
package examples

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemq/idemq/testenv"
)

// TestKafkaConsumerOutside copies examples/kafka-consumer into a new
// module that requires idemq (replaced by this checkout) and runs it
// against a fresh database and kfake, as a user who copied it would.
func TestKafkaConsumerOutside(t *testing.T) {
	out := testenv.RunModule(t, "..", "kafka_consumer", sources(t, "kafka-consumer"))
	if !strings.Contains(out, "ok: every payment booked exactly once") {
		t.Errorf("no ok: line in the copied example's output:\n%s", out)
	}
}

// TestExamplesImportNoTestHelpers keeps every example copyable: the
// repository's test helpers belong in its tests.
func TestExamplesImportNoTestHelpers(t *testing.T) {
	dirs, err := filepath.Glob("*/main.go")
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) == 0 {
		t.Fatal("no examples/*/main.go")
	}
	for _, main := range dirs {
		sources(t, filepath.Dir(main))
	}
}

// sources returns the non-test Go files of the example in dir by name,
// failing t when one imports testenv or idemqtest.
func sources(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		src, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(token.NewFileSet(), p, src, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path := strings.Trim(imp.Path.Value, `"`)
			if strings.HasPrefix(path, "github.com/idemq/idemq/testenv") || strings.HasPrefix(path, "github.com/idemq/idemq/idemqtest") {
				t.Errorf("%s imports %s: the repository's test helpers belong in tests", p, path)
			}
		}
		files[filepath.Base(p)] = src
	}
	return files
}
