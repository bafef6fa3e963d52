package testenv

import (
	"context"
	"errors"
	"fmt"
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
	s := &PostgresServer{dir: dir, port: port, done: make(chan struct{})}
	if err := s.start(ctx, bin, settings); err != nil {
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
func (s *PostgresServer) start(ctx context.Context, bin string, settings []string) error {
	data := filepath.Join(s.dir, "data")
	owner, err := unprivilegedOwner(s.dir)
	if err != nil {
		return err
	}
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres",
		"-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
	initdb.Dir = s.dir
	owner(initdb)
	if out, err := initdb.CombinedOutput(); err != nil {
		return fmt.Errorf("testenv: initdb: %w\n%s", err, out)
	}

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
	cmd := exec.Command(filepath.Join(bin, "postgres"), args...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = s.dir, log, log
	owner(cmd)
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
