// Command withpostgres runs a command with a Postgres server to talk to:
// the one at IDEMQ_TEST_DATABASE_URL (default 127.0.0.1:5432) when
// something answers there, otherwise a private server started from the
// machine's Postgres binaries for as long as the command runs, and removed
// after it (see testenv.EnsurePostgres). The command finds that server in
// IDEMQ_TEST_DATABASE_URL, as the tests do, and in DATABASE_URL, as the
// examples do. `make test` and `make demo` run under it:
//
//	go run ./testenv/withpostgres go test ./...
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"github.com/idemq/idemq/testenv"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: withpostgres COMMAND [ARG...]")
		os.Exit(2)
	}
	os.Exit(run(os.Args[1], os.Args[2:]...))
}

// run runs the command and returns its exit code; the private server, if
// one was started, is removed whatever the command did.
func run(name string, args ...string) int {
	// Ctrl-C reaches the command (same process group) and, forwarded,
	// SIGTERM too; this process waits for it to end, then cleans up.
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	stop, err := testenv.EnsurePostgres(context.Background(), os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if err := stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}()
	cmd := exec.Command(name, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), "DATABASE_URL="+testenv.DatabaseURL())
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "withpostgres:", err)
		return 1
	}
	go func() {
		for sig := range signals {
			_ = cmd.Process.Signal(sig)
		}
	}()
	err = cmd.Wait()
	if exit, ok := errors.AsType[*exec.ExitError](err); ok {
		return max(exit.ExitCode(), 1) // -1 when a signal ended it
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "withpostgres:", err)
		return 1
	}
	return 0
}
