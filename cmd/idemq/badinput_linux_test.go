package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// openPTY opens a pseudo-terminal: what is written to master is read from
// terminal, which a process takes as its standard input.
func openPTY(t *testing.T) (master, terminal *os.File) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("open /dev/ptmx (a Linux pseudo-terminal): %v", err)
	}
	t.Cleanup(func() { master.Close() })
	if err := unix.IoctlSetPointerInt(int(master.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(master.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	terminal, err = os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { terminal.Close() })
	return master, terminal
}

// TestBadInputDLQPurgeAsksOnATerminal: on a terminal, purge prints the count and
// the filter and deletes only after a yes; any other answer deletes
// nothing and exits 1.
func TestBadInputDLQPurgeAsksOnATerminal(t *testing.T) {
	t.Parallel()
	url, ob, _ := deadLetters(t, "payments", "payments", "emails")
	purge := func(answer string) (stderr string, code int) {
		master, terminal := openPTY(t)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, binary, "dlq", "purge", "--destination", "payments")
		cmd.Env = env("DATABASE_URL=" + url)
		var out bytes.Buffer
		cmd.Stdin, cmd.Stdout, cmd.Stderr = terminal, &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if _, err := master.WriteString(answer + "\n"); err != nil {
			t.Fatal(err)
		}
		err := cmd.Wait()
		if exit, ok := err.(*exec.ExitError); ok {
			code = exit.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return out.String(), code
	}

	out, code := purge("n")
	if code != exitFailure || !strings.Contains(out, `purge 2 outbox dead letters matching --destination "payments"? [y/N]`) ||
		!strings.Contains(out, "not confirmed") {
		t.Errorf("purge answered n: exit %d, output %q; want the question, then exit 1", code, out)
	}
	if n := deadCount(t, ob); n != 3 {
		t.Fatalf("%d dead letters after a purge answered n, want 3", n)
	}
	if out, code = purge("y"); code != exitOK || !strings.Contains(out, "purged 2 outbox dead letters") {
		t.Errorf("purge answered y: exit %d, output %q", code, out)
	}
	if n := deadCount(t, ob); n != 1 {
		t.Fatalf("%d dead letters after a purge answered y, want the 1 of emails", n)
	}
}
