// Command idemq operates idemq in production: it applies the migrations of the
// inbox, outbox and webhook tables, runs the outbox relay as a worker with
// health checks and Prometheus metrics, lists, replays and purges dead letters,
// collects expired inbox records and reports backlog and dead-letter counts.
//
// Every command takes its database from --database-url, IDEMQ_DATABASE_URL or
// DATABASE_URL, and otherwise from the libpq variables (PGHOST, PGPORT,
// PGDATABASE, PGUSER, PGPASSWORD, PGSSLMODE, ...) that pgx reads itself.
// Output is a table for people and JSON with --json for scripts. The exit
// codes are listed in [exitCodesHelp].
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// Exit codes, distinct so that scripts and orchestrators can tell a typo from
// an outage.
const (
	exitOK          = 0
	exitFailure     = 1 // anything else: a database error, a broker that refused, ...
	exitUsage       = 2 // a bad flag, argument or configuration value
	exitUnreachable = 3 // the database could not be reached
	exitPending     = 4 // migrations are pending, or a command found the idemq tables missing
	exitNotFound    = 5 // an unknown destination, scope, dead letter or endpoint
)

const exitCodesHelp = `Exit codes:
   0  success
   1  failure (a database or broker error)
   2  bad flag, argument or configuration
   3  database unreachable
   4  migrations pending or tables missing (run idemq migrate)
   5  unknown destination, scope, dead letter or webhook endpoint`

// exitError carries the exit code of a failure to main.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func withCode(code int, format string, args ...any) error {
	return &exitError{code: code, err: fmt.Errorf(format, args...)}
}

func usageError(format string, args ...any) error { return withCode(exitUsage, format, args...) }

func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	if e, ok := errors.AsType[*exitError](err); ok {
		return e.code
	}
	return exitFailure
}

func main() {
	// SIGTERM and Ctrl-C cancel the context: the relay then stops claiming
	// and finishes what is in flight within its shutdown grace.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes the command line args and returns the process's exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	err := notMigrated(newApp(stdout, stderr).Run(ctx, args))
	if err != nil {
		fmt.Fprintln(stderr, "idemq:", err)
	}
	return exitCode(err)
}
