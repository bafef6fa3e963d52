package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/testenv"
)

// binary is the idemq binary the tests run as a user would, built once by
// TestMain with the race detector.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "idemq-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "idemq")
	if out, err := exec.Command("go", "build", "-race", "-o", binary, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// env is the binary's environment: the test's, without any idemq or libpq
// setting that could point it elsewhere, plus extra.
func env(extra ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "IDEMQ_") && !strings.HasPrefix(kv, "PG") && !strings.HasPrefix(kv, "DATABASE_URL=") {
			out = append(out, kv)
		}
	}
	return append(out, extra...)
}

// result is what a finished run of the binary left.
type result struct {
	stdout, stderr string
	code           int
}

// runIdemq runs the binary on the database at dbURL to its end.
func runIdemq(t *testing.T, dbURL string, args ...string) result {
	t.Helper()
	return runWithEnv(t, env("DATABASE_URL="+dbURL), args...)
}

// runWithEnv runs the binary with the environment environ to its end.
func runWithEnv(t *testing.T, environ []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = environ
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	if exit, ok := err.(*exec.ExitError); ok {
		r.code = exit.ExitCode()
	} else if err != nil {
		t.Fatalf("idemq %v: %v", args, err)
	}
	return r
}

// mustRun runs the binary and fails the test unless it exits 0.
func mustRun(t *testing.T, dbURL string, args ...string) string {
	t.Helper()
	r := runIdemq(t, dbURL, args...)
	if r.code != 0 {
		t.Fatalf("idemq %v: exit %d\nstdout: %s\nstderr: %s", args, r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// mustJSON runs the binary with --json and decodes its output into v.
func mustJSON(t *testing.T, dbURL string, v any, args ...string) {
	t.Helper()
	out := mustRun(t, dbURL, append([]string{"--json"}, args...)...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("idemq %v: output is not JSON: %v\n%s", args, err, out)
	}
}

// wantCode runs the binary and checks its exit code.
func wantCode(t *testing.T, dbURL string, code int, args ...string) result {
	t.Helper()
	r := runIdemq(t, dbURL, args...)
	if r.code != code {
		t.Fatalf("idemq %v: exit %d, want %d\nstdout: %s\nstderr: %s", args, r.code, code, r.stdout, r.stderr)
	}
	return r
}

// process is the binary running in the background.
type process struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	done   chan struct{} // closed when it exited
	err    error         // its exit, once done is closed
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// start runs the binary in the background; the test's cleanup kills it if
// it still runs.
func start(t *testing.T, dbURL string, args ...string) *process {
	t.Helper()
	return startEnv(t, env("DATABASE_URL="+dbURL), args...)
}

// startEnv is start with the environment environ.
func startEnv(t *testing.T, environ []string, args ...string) *process {
	t.Helper()
	p := &process{cmd: exec.Command(binary, args...), stderr: &syncBuffer{}, done: make(chan struct{})}
	p.cmd.Env = environ
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("idemq %v stderr:\n%s", args, p.stderr.String())
		}
	})
	return p
}

// signal sends sig and waits up to limit for the process to exit, returning
// its exit code.
func (p *process) signal(t *testing.T, sig syscall.Signal, limit time.Duration) int {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(limit):
		t.Fatalf("idemq did not exit within %v of %v\nstderr: %s", limit, sig, p.stderr.String())
	}
	if exit, ok := p.err.(*exec.ExitError); ok {
		return exit.ExitCode()
	}
	return 0
}

// freeAddr returns a loopback address no one listens on right now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// get fetches a URL and returns its status and body.
func get(url string) (int, string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, err = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String(), err
}

// database creates a fresh database, migrated by the binary, and returns
// its URL, a pool on it and its outbox.
func database(t *testing.T) (string, *pgxpool.Pool, *outbox.Outbox) {
	t.Helper()
	url := testenv.PostgresURL(t)
	mustRun(t, url, "migrate")
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ob, err := outbox.New(pool, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return url, pool, ob
}

// pending returns the outbox's pending count.
func pending(t *testing.T, ob *outbox.Outbox) int64 {
	t.Helper()
	return outboxStats(t, ob).Pending
}

// outboxStats returns the outbox's counts.
func outboxStats(t *testing.T, ob *outbox.Outbox) outbox.Stats {
	t.Helper()
	s, err := ob.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return s
}
