package relaytest

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// A crash test kills a relay the way an operating system or an operator
// does, with SIGKILL: nothing runs after it, no deferred call, no
// rollback, no goodbye to the database. No goroutine can play that part,
// so the test binary re-executes itself: the parent runs a test,
// [StartChild] starts the same test in a child process, whose first line
// ([ChildArgs]) finds it is the child and runs a relay instead of the
// test, until the parent kills it ([Child.Kill]).

// childEnv carries a child's test name and arguments.
const childEnv = "IDEMQ_RELAYTEST_CHILD"

// Child is a process started by [StartChild].
type Child struct {
	cmd  *exec.Cmd
	once sync.Once
}

// StartChild re-executes the test binary to run tb's test as a child
// process, which finds args with [ChildArgs]. The child's standard error
// goes to stderr (nil: discarded). A child still running at tb's cleanup
// is killed then.
func StartChild(tb testing.TB, args string, stderr io.Writer) *Child {
	tb.Helper()
	parts := strings.Split(tb.Name(), "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	cmd := exec.Command(os.Args[0], "-test.run="+strings.Join(parts, "/"), "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+tb.Name()+"\n"+args)
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		tb.Fatalf("relaytest: start a child process: %v", err)
	}
	c := &Child{cmd: cmd}
	tb.Cleanup(func() { _ = c.kill() })
	return c
}

// ChildArgs returns the args the parent gave [StartChild] and true when
// this process is tb's child; "" and false in the parent.
func ChildArgs(tb testing.TB) (string, bool) {
	name, args, ok := strings.Cut(os.Getenv(childEnv), "\n")
	if !ok || name != tb.Name() {
		return "", false
	}
	return args, true
}

// Kill sends the child SIGKILL and waits until it is gone.
func (c *Child) Kill(tb testing.TB) {
	tb.Helper()
	if err := c.kill(); err != nil {
		tb.Fatalf("relaytest: kill the child: %v", err)
	}
}

func (c *Child) kill() (err error) {
	c.once.Do(func() {
		if err = c.cmd.Process.Kill(); errors.Is(err, os.ErrProcessDone) {
			err = nil
		}
		_ = c.cmd.Wait()
	})
	return err
}

// Hang keeps a child process alive after it started its relay, until its
// parent kills it: two minutes at most, should the parent be gone.
func Hang() { time.Sleep(2 * time.Minute) }
