package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// postgresServerHelp says how to get the binaries [StartPostgres] runs.
const postgresServerHelp = `install the Postgres server package (it provides initdb and postgres):
	apt-get install postgresql        (Debian, Ubuntu)
	dnf install postgresql-server     (Fedora, RHEL)
	brew install postgresql           (macOS)
or point IDEMQ_TEST_DATABASE_URL at a running server`

// ErrNoPostgresBinaries is returned by [StartPostgres] when neither
// pg_config --bindir, /usr/lib/postgresql/*/bin nor PATH holds initdb and
// postgres; its message says which package to install.
var ErrNoPostgresBinaries = errors.New("testenv: the Postgres server binaries (initdb, postgres) are not installed; " + postgresServerHelp)

// PostgresServer is a Postgres server of its own: a cluster initialised
// into a temporary directory, listening on a free loopback port, with
// trust authentication for the user postgres. Tests that change server
// settings (max_prepared_transactions, ...) or stop the server use one; so
// do `make test` and `make demo` when nothing answers at the configured
// address. [PostgresServer.Stop] stops it and removes the directory.
type PostgresServer struct {
	bin  string // the directory of initdb and postgres
	dir  string // temporary directory: data/ and postgres.log
	port int
	cmd  *exec.Cmd
	done chan struct{} // closed when the postgres process has exited
	err  error         // its exit error, set before done closes

	stopOnce sync.Once
	stopErr  error
}

// StartPostgres initialises a cluster into a new temporary directory and
// starts postgres on a free 127.0.0.1 port, with each of settings
// ("max_prepared_transactions=10") passed as -c. It returns once the server
// accepts connections. When the process runs as root, which postgres
// refuses, the cluster runs as the unprivileged OS user postgres (or nobody).
// The caller must call [PostgresServer.Stop].
func StartPostgres(ctx context.Context, settings ...string) (*PostgresServer, error) {
	for _, s := range settings {
		if name, _, ok := strings.Cut(s, "="); !ok || name == "" {
			return nil, fmt.Errorf("testenv: Postgres setting %q: want name=value", s)
		}
	}
	bin, err := postgresBinDir(postgresBinDirs())
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "idemq-postgres-")
	if err != nil {
		return nil, fmt.Errorf("testenv: temporary directory for Postgres: %w", err)
	}
	s := &PostgresServer{bin: bin, dir: dir, port: port, done: make(chan struct{})}
	if err := s.start(ctx, settings); err != nil {
		return nil, errors.Join(err, s.Stop())
	}
	return s, nil
}

// PrivatePostgres is [StartPostgres] for a test: missing binaries or a
// server that does not come up fail tb with a message that says what to
// install, and the server is stopped and removed at cleanup.
func PrivatePostgres(tb testing.TB, settings ...string) *PostgresServer {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := StartPostgres(ctx, settings...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := s.Stop(); err != nil {
			tb.Error(err)
		}
	})
	return s
}

// URL is the admin connection string of the server's postgres database.
func (s *PostgresServer) URL() string {
	return "postgres://postgres@" + net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) + "/postgres?sslmode=disable"
}

// Stop shuts the server down (a fast shutdown, then a kill after 30
// seconds) and removes its directory. It may be called more than once.
func (s *PostgresServer) Stop() error {
	s.stopOnce.Do(func() {
		if s.cmd != nil {
			_ = s.cmd.Process.Signal(os.Interrupt) // fast shutdown: end sessions, no waiting for clients
			select {
			case <-s.done:
			case <-time.After(30 * time.Second):
				_ = s.cmd.Process.Kill()
				<-s.done
			}
		}
		if err := os.RemoveAll(s.dir); err != nil {
			s.stopErr = fmt.Errorf("testenv: remove the private Postgres directory: %w", err)
		}
	})
	return s.stopErr
}

// start runs initdb and then postgres, and waits until it answers.
func (s *PostgresServer) start(ctx context.Context, settings []string) error {
	data := filepath.Join(s.dir, "data")
	owner, err := unprivilegedOwner(s.dir)
	if err != nil {
		return err
	}
	initdb := exec.CommandContext(ctx, filepath.Join(s.bin, "initdb"), "-D", data, "-U", "postgres",
		"-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
	initdb.Dir = s.dir
	owner(initdb)
	if out, err := initdb.CombinedOutput(); err != nil {
		return fmt.Errorf("testenv: initdb: %w\n%s", err, out)
	}
	return s.serve(ctx, owner, settings)
}

// StartStandby starts a streaming-replication standby of s: a base backup
// of s (pg_basebackup -R, so that it follows s) in a new temporary
// directory, served by postgres on a free 127.0.0.1 port, read-only (hot
// standby). It returns once the standby accepts connections. The caller
// must call [PostgresServer.Stop] on it.
func (s *PostgresServer) StartStandby(ctx context.Context, settings ...string) (*PostgresServer, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "idemq-postgres-standby-")
	if err != nil {
		return nil, fmt.Errorf("testenv: temporary directory for the standby: %w", err)
	}
	st := &PostgresServer{bin: s.bin, dir: dir, port: port, done: make(chan struct{})}
	err = func() error {
		owner, err := unprivilegedOwner(dir)
		if err != nil {
			return err
		}
		backup := exec.CommandContext(ctx, filepath.Join(s.bin, "pg_basebackup"), "-D", filepath.Join(dir, "data"), "-R",
			"-X", "stream", "--no-sync", "-c", "fast", "-h", "127.0.0.1", "-p", strconv.Itoa(s.port), "-U", "postgres")
		backup.Dir = dir
		owner(backup)
		if out, err := backup.CombinedOutput(); err != nil {
			return fmt.Errorf("testenv: pg_basebackup: %w\n%s", err, out)
		}
		return st.serve(ctx, owner, settings)
	}()
	if err != nil {
		return nil, errors.Join(err, st.Stop())
	}
	return st, nil
}

// PrivateStandby is [PostgresServer.StartStandby] for a test: a failure
// fails tb, and the standby is stopped and removed at cleanup.
func (s *PostgresServer) PrivateStandby(tb testing.TB, settings ...string) *PostgresServer {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := s.StartStandby(ctx, settings...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := st.Stop(); err != nil {
			tb.Error(err)
		}
	})
	return st
}

// serve runs postgres on the cluster in s.dir/data, as owner, and waits
// until it answers.
func (s *PostgresServer) serve(ctx context.Context, owner func(*exec.Cmd), settings []string) error {
	data := filepath.Join(s.dir, "data")
	logPath := filepath.Join(s.dir, "postgres.log")
	log, err := os.Create(logPath)
	if err != nil {
		return fmt.Errorf("testenv: Postgres log: %w", err)
	}
	defer log.Close()
	args := []string{"-D", data, "-p", strconv.Itoa(s.port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=", // TCP only: no socket path to collide or be too long
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"}
	for _, setting := range settings {
		args = append(args, "-c", setting)
	}
	cmd := exec.Command(filepath.Join(s.bin, "postgres"), args...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = s.dir, log, log
	owner(cmd)
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("testenv: start postgres: %w", err)
	}
	s.cmd = cmd
	go func() { s.err = cmd.Wait(); close(s.done) }()

	if err := s.waitReady(ctx); err != nil {
		logText, _ := os.ReadFile(logPath)
		return fmt.Errorf("%w\npostgres log:\n%s", err, logText)
	}
	return nil
}

// waitReady waits until the server accepts a session, for at most 30
// seconds, and fails early when postgres exits.
func (s *PostgresServer) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		conn, err := pgx.Connect(ctx, s.URL())
		if err == nil {
			return conn.Close(ctx)
		}
		select {
		case <-s.done:
			return fmt.Errorf("testenv: postgres exited before it accepted connections: %v", s.err)
		case <-ctx.Done():
			return fmt.Errorf("testenv: private Postgres did not come up on port %d: %w", s.port, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// postgresBinDirs lists where initdb and postgres may be, best first:
// pg_config --bindir, the newest /usr/lib/postgresql/N/bin (Debian and
// Ubuntu keep them off PATH), PATH.
func postgresBinDirs() []string {
	var dirs []string
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dirs = append(dirs, strings.TrimSpace(string(out)))
	}
	versions, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(versions, func(i, j int) bool { return majorVersion(versions[i]) > majorVersion(versions[j]) })
	dirs = append(dirs, versions...)
	if p, err := exec.LookPath("postgres"); err == nil {
		dirs = append(dirs, filepath.Dir(p))
	}
	return dirs
}

// postgresBinDir returns the first of dirs that holds both initdb and
// postgres (pg_config may come from a client package without them).
func postgresBinDir(dirs []string) (string, error) {
	for _, dir := range dirs {
		if isExecutable(filepath.Join(dir, "initdb")) && isExecutable(filepath.Join(dir, "postgres")) {
			return dir, nil
		}
	}
	return "", ErrNoPostgresBinaries
}

// majorVersion is N of /usr/lib/postgresql/N/bin, 0 when N is not a number.
func majorVersion(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

func isExecutable(path string) bool {
	info, err := os.Stat(path)
	return err == nil && !info.IsDir() && info.Mode()&0o111 != 0
}

// EnsurePostgres makes sure a Postgres server answers at [DatabaseURL], for
// `make test`, `make demo` and programs like them. When something answers
// at the configured address it does nothing. When nothing does (Postgres
// installed but not running, or not on 127.0.0.1:5432), it starts a
// private server ([StartPostgres]), points IDEMQ_TEST_DATABASE_URL at it
// for this process and the processes it starts, and says so in one line on
// w. stop stops that server and removes its directory.
func EnsurePostgres(ctx context.Context, w io.Writer) (stop func() error, err error) {
	addr, network, err := postgresAddr(DatabaseURL())
	if err != nil {
		return nil, err
	}
	if c, err := net.DialTimeout(network, addr, 2*time.Second); err == nil {
		return func() error { return nil }, c.Close()
	}
	s, err := StartPostgres(ctx)
	if err != nil {
		return nil, fmt.Errorf("testenv: nothing answers at %s and no private Postgres could be started: %w", addr, err)
	}
	if err := os.Setenv("IDEMQ_TEST_DATABASE_URL", s.URL()); err != nil {
		return nil, errors.Join(err, s.Stop())
	}
	fmt.Fprintf(w, "testenv: nothing answers at %s; using a private Postgres on 127.0.0.1:%d from %s, removed at exit\n",
		addr, s.port, s.bin)
	return s.Stop, nil
}

// postgresAddr returns the address a connection string's first host
// names: host:port over TCP, or a Unix socket path.
func postgresAddr(connString string) (addr, network string, err error) {
	cfg, err := pgconn.ParseConfig(connString)
	if err != nil {
		return "", "", fmt.Errorf("testenv: IDEMQ_TEST_DATABASE_URL: %w", err)
	}
	port := strconv.Itoa(int(cfg.Port))
	if strings.HasPrefix(cfg.Host, "/") {
		return filepath.Join(cfg.Host, ".s.PGSQL."+port), "unix", nil
	}
	return net.JoinHostPort(cfg.Host, port), "tcp", nil
}
