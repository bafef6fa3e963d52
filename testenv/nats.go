package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATSURLEnv names the environment variable that points the NATS helpers at
// a running server with JetStream enabled (for example nats://127.0.0.1:4222)
// instead of an in-process one.
const NATSURLEnv = "IDEMQ_TEST_NATS_URL"

const natsHelp = `unset ` + NATSURLEnv + ` to use an in-process server, or point it at a
reachable NATS server started with JetStream (nats-server -js)`

// NATSServer is a NATS server with JetStream for one test (or one demo run):
// either an in-process github.com/nats-io/nats-server/v2 server storing its
// streams in a temporary directory, or the server named by
// IDEMQ_TEST_NATS_URL.
//
// Names are isolated per server value: [NATSServer.Name] turns the logical
// name a test uses ("ORDERS", "orders") into a unique one, so parallel tests
// sharing a real server never see each other's streams or subjects. Streams
// made with [NATSServer.CreateStream] are deleted at [NATSServer.Close] on a
// real server; an in-process server takes everything with it.
type NATSServer struct {
	// URL is the client URL (nats://host:port).
	URL string

	suffix   string
	external bool

	mu       sync.Mutex
	srv      *server.Server // nil on a real server or while stopped
	opts     *server.Options
	storeDir string
	ownsDir  bool
	streams  []string // created through CreateStream, deleted on a real server
}

// NATS returns a NATS server with JetStream for tb, closed at cleanup.
// Without IDEMQ_TEST_NATS_URL it starts one in-process on a random port of
// 127.0.0.1 with its store in tb.TempDir(); with it, it checks that the
// server is reachable and has JetStream. A missing server fails the test
// with a message saying what to do.
func NATS(tb testing.TB) *NATSServer {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := startNATS(ctx, tb.TempDir())
	if err != nil {
		tb.Fatalf("testenv: %v\n%s", err, natsHelp)
	}
	tb.Cleanup(func() {
		if err := n.Close(); err != nil {
			tb.Errorf("testenv: close NATS: %v", err)
		}
	})
	return n
}

// StartNATS is [NATS] for programs (examples, the demo): the caller must
// call [NATSServer.Close], which stops the in-process server and removes
// its store, or deletes the streams created on a real server.
func StartNATS(ctx context.Context) (*NATSServer, error) {
	dir, err := os.MkdirTemp("", "idemq-nats-")
	if err != nil {
		return nil, fmt.Errorf("testenv: nats store dir: %w", err)
	}
	n, err := startNATS(ctx, dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	n.ownsDir = true
	return n, nil
}

func startNATS(ctx context.Context, storeDir string) (*NATSServer, error) {
	n := &NATSServer{suffix: randomSuffix()[:12], storeDir: storeDir}
	if env := os.Getenv(NATSURLEnv); env != "" {
		n.URL = env
		n.external = true
		if err := n.checkJetStream(ctx); err != nil {
			return nil, fmt.Errorf("nats at %s: %w", env, err)
		}
		return n, nil
	}
	n.opts = &server.Options{
		ServerName: "idemq-test",
		Host:       "127.0.0.1",
		Port:       server.RANDOM_PORT,
		NoLog:      true,
		NoSigs:     true,
		JetStream:  true,
		StoreDir:   storeDir,
		// Bounded so that parallel tests on a small machine cannot claim
		// most of its memory or disk.
		JetStreamMaxMemory: 256 << 20,
		JetStreamMaxStore:  1 << 30,
		MaxPayload:         server.MAX_PAYLOAD_SIZE,
	}
	srv, err := n.start()
	if err != nil {
		return nil, err
	}
	// Pin the port the server picked so that Restart comes back on it.
	n.opts.Port = srv.Addr().(*net.TCPAddr).Port
	n.srv = srv
	n.URL = srv.ClientURL()
	return n, nil
}

func (n *NATSServer) start() (*server.Server, error) {
	srv, err := server.NewServer(n.opts)
	if err != nil {
		return nil, fmt.Errorf("start in-process nats: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(20 * time.Second) {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, errors.New("start in-process nats: not ready for connections after 20s")
	}
	if !srv.JetStreamEnabled() {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, errors.New("start in-process nats: JetStream did not start")
	}
	return srv, nil
}

func (n *NATSServer) checkJetStream(ctx context.Context) error {
	nc, err := nats.Connect(n.URL, nats.Timeout(5*time.Second))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if _, err := js.AccountInfo(ctx); err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	return nil
}

// External reports whether the server is the one named by
// IDEMQ_TEST_NATS_URL (and so cannot be stopped or restarted).
func (n *NATSServer) External() bool { return n.external }

// Name returns a stream or subject token unique to this server value for
// the logical name: logical + "_" + a random suffix. It contains neither
// '.', '*', '>' nor whitespace, so it is valid both as a stream name and as
// one token of a subject.
func (n *NATSServer) Name(logical string) string { return logical + "_" + n.suffix }

// Connect opens a client connection that keeps reconnecting (every 50ms,
// without limit) while the server is stopped, so that tests restarting the
// server see the client come back by itself. The caller closes it.
func (n *NATSServer) Connect(opts ...nats.Option) (*nats.Conn, error) {
	base := []nats.Option{
		nats.Name("idemq-test"),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(50 * time.Millisecond),
		nats.ReconnectJitter(0, 0),
		nats.Timeout(5 * time.Second),
	}
	return nats.Connect(n.URL, append(base, opts...)...)
}

// ConnectTB is [NATSServer.Connect] that fails tb on error and closes the
// connection at cleanup.
func (n *NATSServer) ConnectTB(tb testing.TB, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	nc, err := n.Connect(opts...)
	if err != nil {
		tb.Fatalf("testenv: connect to NATS at %s: %v\n%s", n.URL, err, natsHelp)
	}
	tb.Cleanup(nc.Close)
	return nc
}

// CreateStream creates (or updates) a stream through js and remembers its
// name, so that [NATSServer.Close] deletes it on a real server. Give it a
// name and subjects made with [NATSServer.Name].
func (n *NATSServer) CreateStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	s, err := js.CreateOrUpdateStream(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("testenv: create stream %s: %w", cfg.Name, err)
	}
	n.mu.Lock()
	n.streams = append(n.streams, cfg.Name)
	n.mu.Unlock()
	return s, nil
}

// Stop shuts the in-process server down (connections refused) until
// [NATSServer.Restart]; its streams, messages and consumers survive in the
// store directory. It fails on a real server.
func (n *NATSServer) Stop() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.external {
		return errors.New("testenv: cannot stop the NATS server at " + NATSURLEnv)
	}
	if n.srv != nil {
		n.srv.Shutdown()
		n.srv.WaitForShutdown()
		n.srv = nil
	}
	return nil
}

// Restart brings a stopped in-process server back on the same port with
// the same store: streams, messages, consumers and their acknowledgement
// state are recovered. Restart on a running server stops it first. It fails
// on a real server.
func (n *NATSServer) Restart() error {
	if err := n.Stop(); err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	var err error
	for range 50 { // the port may linger for a moment after Shutdown
		var srv *server.Server
		if srv, err = n.start(); err == nil {
			n.srv = srv
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("testenv: restart nats on port %d: %w", n.opts.Port, err)
}

// Close stops the in-process server (removing its store if [StartNATS]
// made it), or deletes the streams created through
// [NATSServer.CreateStream] on a real server.
func (n *NATSServer) Close() error {
	if n.external {
		return n.deleteStreams()
	}
	err := n.Stop()
	if n.ownsDir {
		err = errors.Join(err, os.RemoveAll(n.storeDir))
	}
	return err
}

func (n *NATSServer) deleteStreams() error {
	n.mu.Lock()
	names := n.streams
	n.streams = nil
	n.mu.Unlock()
	if len(names) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, err := nats.Connect(n.URL, nats.Timeout(5*time.Second))
	if err != nil {
		return fmt.Errorf("delete streams %s: %w", strings.Join(names, ", "), err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range names {
		if err := js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			errs = append(errs, fmt.Errorf("delete stream %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}
