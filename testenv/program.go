package testenv

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

// ProgramFunc is the body of an example program: it does its scenario,
// prints what happened on out and returns an error unless every count was
// right.
type ProgramFunc func(ctx context.Context, out io.Writer) error

// RunProgram runs an example program's body as a test: it fails unless
// run returns nil within timeout and prints every line fragment of want.
// The output is logged.
func RunProgram(tb testing.TB, timeout time.Duration, run ProgramFunc, want ...string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, &out); err != nil {
		tb.Fatalf("%v\n%s", err, out.String())
	}
	for _, w := range want {
		if !strings.Contains(out.String(), w) {
			tb.Errorf("no %q in the output:\n%s", w, out.String())
		}
	}
	tb.Log("\n" + out.String())
}
