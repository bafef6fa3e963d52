package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"
)

// ProgramFunc is the body of an example program: it does its scenario,
// prints what happened on out and returns an error unless every count was
// right.
type ProgramFunc func(ctx context.Context, out io.Writer) error

// Main runs an example program's body as its main function: with a
// context that SIGINT and SIGTERM cancel and that ends after timeout, and
// with Postgres made sure of ([EnsurePostgres]: the server at
// IDEMQ_TEST_DATABASE_URL, or a private one removed at exit). It prints an
// error on stderr and exits 1 when run fails.
func Main(name string, timeout time.Duration, run ProgramFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	stopPostgres, err := EnsurePostgres(ctx, os.Stdout)
	if err == nil {
		err = errors.Join(run(ctx, os.Stdout), stopPostgres())
	}
	cancel()
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}

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
