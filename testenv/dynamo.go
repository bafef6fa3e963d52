package testenv

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

const dynaliteHelp = `install it with
	npm ci --prefix testenv
(Node.js and npm are needed) or point IDEMQ_TEST_DYNAMODB_URL at a DynamoDB API endpoint`

// DynamoDBURL returns the endpoint of the DynamoDB API server tests share:
// IDEMQ_TEST_DYNAMODB_URL if set, otherwise a dynalite started once per
// test binary (from testenv's node_modules), which exits with it.
func DynamoDBURL(tb testing.TB) string {
	tb.Helper()
	if u := os.Getenv("IDEMQ_TEST_DYNAMODB_URL"); u != "" {
		return u
	}
	shared.once.Do(func() {
		shared.server, shared.err = startDynalite(false)
	})
	if shared.err != nil {
		tb.Fatal(shared.err)
	}
	return shared.server.URL()
}

// shared is the dynalite of the test binary.
var shared struct {
	once   sync.Once
	server *Dynalite
	err    error
}

// DynamoDB returns a client of the shared DynamoDB API server and a table
// name prefix that is tb's own.
func DynamoDB(tb testing.TB) (client *dynamodb.Client, tablePrefix string) {
	tb.Helper()
	return DynamoDBClient(DynamoDBURL(tb)), "idemq_test_" + randomSuffix()
}

// DynamoDBClient returns a client of the DynamoDB API at endpoint with
// static test credentials, for dynalite or DynamoDB Local.
func DynamoDBClient(endpoint string) *dynamodb.Client {
	return dynamodb.New(dynamodb.Options{
		BaseEndpoint: aws.String(endpoint),
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
	})
}

// Dynalite is a dynalite process (a DynamoDB API server). One started by
// [StartDynalite] belongs to its test and keeps its data on LevelDB, so
// that the test may stop it and start it again on the same port with the
// same data (an outage); the shared one keeps its data in memory.
type Dynalite struct {
	tb   testing.TB // nil for the shared server
	cli  string
	port int
	dir  string // LevelDB data; "" keeps it in memory

	mu  sync.Mutex
	cmd *exec.Cmd
	// stdin is the pipe whose end makes dynalite exit: if the test
	// binary dies, the pipe closes and so does the server.
	stdin io.Closer
}

// StartDynalite starts a dynalite of tb's own on a free loopback port; it
// is stopped at cleanup.
func StartDynalite(tb testing.TB) *Dynalite {
	tb.Helper()
	d, err := startDynalite(true)
	if err != nil {
		tb.Fatal(err)
	}
	d.tb = tb
	tb.Cleanup(func() {
		d.Stop()
		d.removeData()
	})
	return d
}

// URL is the server's endpoint.
func (d *Dynalite) URL() string {
	return "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(d.port))
}

// Client returns a client of the server.
func (d *Dynalite) Client() *dynamodb.Client { return DynamoDBClient(d.URL()) }

// startDynalite starts a dynalite in memory, or on LevelDB in a temporary
// directory when its data must survive a restart.
func startDynalite(persistent bool) (*Dynalite, error) {
	_, file, _, _ := runtime.Caller(0)
	cli := filepath.Join(filepath.Dir(file), "node_modules", "dynalite", "cli.js")
	if _, err := os.Stat(cli); err != nil {
		return nil, fmt.Errorf("testenv: dynalite is not installed (%v); %s", err, dynaliteHelp)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	d := &Dynalite{cli: cli, port: port}
	if persistent {
		if d.dir, err = os.MkdirTemp("", "idemq-dynalite-"); err != nil {
			return nil, err
		}
	}
	if err := d.start(); err != nil {
		d.removeData()
		return nil, err
	}
	return d, nil
}

// exitWithStdin runs dynalite's command line and exits when stdin ends.
const exitWithStdin = `process.stdin.on('end', () => process.exit(0)); process.stdin.resume();
process.argv = [process.argv[0], 'dynalite'].concat(process.argv.slice(2));
require(process.env.DYNALITE_CLI);`

func (d *Dynalite) start() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd != nil {
		return nil
	}
	args := []string{"-e", exitWithStdin, "--", "--host", "127.0.0.1", "--port", strconv.Itoa(d.port),
		"--createTableMs", "0", "--deleteTableMs", "0", "--updateTableMs", "0"}
	if d.dir != "" {
		args = append(args, "--path", d.dir)
	}
	cmd := exec.Command("node", args...)
	cmd.Env = append(os.Environ(), "DYNALITE_CLI="+d.cli)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("testenv: start dynalite: %w; %s", err, dynaliteHelp)
	}
	d.cmd, d.stdin = cmd, stdin
	return dialWait("dynalite", net.JoinHostPort("127.0.0.1", strconv.Itoa(d.port)))
}

// Start starts the server again after Stop, on the same port with the
// same data.
func (d *Dynalite) Start() {
	d.tb.Helper()
	if err := d.start(); err != nil {
		d.tb.Fatal(err)
	}
}

func (d *Dynalite) removeData() {
	if d.dir != "" {
		_ = os.RemoveAll(d.dir)
	}
}

// Stop kills the server and waits for it to exit.
func (d *Dynalite) Stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd == nil {
		return
	}
	_ = d.cmd.Process.Kill()
	_ = d.cmd.Wait()
	_ = d.stdin.Close()
	d.cmd = nil
}
