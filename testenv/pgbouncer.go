package testenv

import (
	"bytes"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
)

// PgBouncerExecMode is the pgx query execution mode that connection strings
// through [PgBouncer] carry (default_query_exec_mode). PgBouncer before
// 1.21 does not track protocol-level prepared statements in transaction
// mode, so two of pgx's modes fail through it as soon as clients share
// server connections: cache_statement, the default (named statements
// prepared once per client connection: "prepared statement stmtcache_…
// already exists", 42P05), and describe_exec (an unnamed statement
// described in one exchange and executed in the next, which may reach
// another server connection: "unnamed prepared statement does not exist",
// 26000). cache_describe parses, binds and executes each statement in one
// exchange and caches only its description: no extra round trip once
// cached. exec and simple_protocol work too (simple_protocol also gives
// up binary results).
const PgBouncerExecMode = "cache_describe"

const pgbouncerHelp = `install it (Debian/Ubuntu: apt-get install -y pgbouncer; make test does it when missing)`

// PgBouncer starts a pgbouncer of tb's own (from PATH, or /usr/sbin where
// Debian puts it) in transaction mode on a free loopback port, in front of
// the server of connString, and returns connString rerouted through it
// with default_query_exec_mode=[PgBouncerExecMode]. It is stopped at
// cleanup. pgbouncer refuses to run as root: as root, it runs as the user
// postgres. A missing pgbouncer fails tb with a message that says how to
// install it.
func PgBouncer(tb testing.TB, connString string) string {
	tb.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/pgbouncer"); serr != nil {
			tb.Fatalf("testenv: pgbouncer is not on PATH (%v); %s", err, pgbouncerHelp)
		}
		bin = "/usr/sbin/pgbouncer"
	}
	cfg, err := pgx.ParseConfig(connString)
	if err != nil {
		tb.Fatalf("testenv: PgBouncer: %v", err)
	}
	port, err := freePort()
	if err != nil {
		tb.Fatal(err)
	}
	// Not tb.TempDir: the directory must be readable by the user
	// pgbouncer switches to.
	dir, err := os.MkdirTemp("", "idemq-pgbouncer-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	// auth_type any: clients log in under any name, pgbouncer logs in to
	// the server as the configured user.
	server := fmt.Sprintf("host=%s port=%d user=%s", cfg.Host, cfg.Port, cfg.User)
	if cfg.Password != "" {
		server += " password=" + cfg.Password
	}
	ini := fmt.Sprintf(`[databases]
* = %s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = any
pool_mode = transaction
max_client_conn = 1000
default_pool_size = 50
ignore_startup_parameters = extra_float_digits
`, server, port)
	path := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(path, []byte(ini), 0o644); err != nil {
		tb.Fatal(err)
	}
	args := []string{path}
	if os.Geteuid() == 0 {
		if _, err := user.Lookup("postgres"); err != nil {
			tb.Fatalf("testenv: pgbouncer refuses to run as root and there is no user postgres to run it as (%v); run the tests as another user or create one", err)
		}
		args = []string{"-u", "postgres", path}
	}
	var out syncBuffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		tb.Fatalf("testenv: start pgbouncer: %v", err)
	}
	tb.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	addr := "127.0.0.1:" + strconv.Itoa(port)
	if err := dialWait("pgbouncer", addr); err != nil {
		tb.Fatalf("%v\npgbouncer said:\n%s", err, out.String())
	}
	return throughPort(connString, port)
}

// throughPort returns connString pointed at 127.0.0.1:port with
// default_query_exec_mode=PgBouncerExecMode.
func throughPort(connString string, port int) string {
	if u, err := url.Parse(connString); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Host = "127.0.0.1:" + strconv.Itoa(port)
		q := u.Query()
		q.Set("default_query_exec_mode", PgBouncerExecMode)
		u.RawQuery = q.Encode()
		return u.String()
	}
	return strings.Join([]string{connString, "host=127.0.0.1", "port=" + strconv.Itoa(port), "default_query_exec_mode=" + PgBouncerExecMode}, " ")
}

// syncBuffer is a bytes.Buffer safe for a process's output and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
