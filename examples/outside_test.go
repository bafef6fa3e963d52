// Package examples holds programs a user copies into a module of their
// own; its test proves that such a copy works outside this repository.
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
	files := map[string][]byte{}
	paths, err := filepath.Glob("kafka-consumer/*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		if files[filepath.Base(p)], err = os.ReadFile(p); err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(token.NewFileSet(), p, files[filepath.Base(p)], parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			if path := strings.Trim(imp.Path.Value, `"`); strings.HasPrefix(path, "github.com/idemq/idemq/testenv") || strings.HasPrefix(path, "github.com/idemq/idemq/idemqtest") {
				t.Errorf("%s imports %s: the repository's test helpers belong in tests", p, path)
			}
		}
	}
	out := testenv.RunModule(t, "..", "kafka_consumer", files)
	if !strings.Contains(out, "ok: every payment booked exactly once") {
		t.Errorf("no ok: line in the copied example's output:\n%s", out)
	}
}
