package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultRedisURL is the Redis used when IDEMQ_TEST_REDIS_URL is unset: the
// machine's server.
const DefaultRedisURL = "redis://127.0.0.1:6379/0"

const redisHelp = `start it with
	redis-server --daemonize yes
or point IDEMQ_TEST_REDIS_URL at a server (redis://host:port/db)`

// RedisURL returns the URL of the Redis server tests share.
func RedisURL() string {
	if u := os.Getenv("IDEMQ_TEST_REDIS_URL"); u != "" {
		return u
	}
	return DefaultRedisURL
}

// Redis returns a client of the shared Redis server and a key prefix that
// is tb's own; keys under the prefix are deleted at cleanup. An
// unreachable server fails tb with a message that says how to start one.
func Redis(tb testing.TB) (client *redis.Client, prefix string) {
	tb.Helper()
	opts, err := redis.ParseURL(RedisURL())
	if err != nil {
		tb.Fatalf("testenv: IDEMQ_TEST_REDIS_URL: %v", err)
	}
	client = redis.NewClient(opts)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := client.Ping(ctx).Err(); err != nil {
		_ = client.Close()
		tb.Fatalf("testenv: Redis is not reachable at %s: %v\n%s", opts.Addr, err, redisHelp)
	}
	prefix = "idemq_test_" + randomSuffix()
	tb.Cleanup(func() {
		defer client.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		iter := client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if len(keys) > 0 {
			client.Unlink(ctx, keys...)
		}
	})
	return client, prefix
}

// RedisServer is a redis-server process of a test's own, which the test
// may stop and start again on the same port (an outage).
type RedisServer struct {
	tb   testing.TB
	port int

	mu  sync.Mutex
	cmd *exec.Cmd
}

// StartRedis starts redis-server (from PATH) on a free loopback port,
// without persistence; it is killed at cleanup.
func StartRedis(tb testing.TB) *RedisServer {
	tb.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		tb.Fatalf("testenv: redis-server is not on PATH (%v); install it (apt-get install redis-server)", err)
	}
	port, err := freePort()
	if err != nil {
		tb.Fatal(err)
	}
	s := &RedisServer{tb: tb, port: port}
	s.Start()
	tb.Cleanup(s.Stop)
	return s
}

// Addr is the server's host:port.
func (s *RedisServer) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Client returns a new client of the server, closed at cleanup.
func (s *RedisServer) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	s.tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Start starts the server (again) and waits until it answers; it does
// nothing while the server runs.
func (s *RedisServer) Start() {
	s.tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return
	}
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning")
	if err := cmd.Start(); err != nil {
		s.tb.Fatalf("testenv: start redis-server: %v", err)
	}
	s.cmd = cmd
	if err := dialWait("redis-server", s.Addr()); err != nil {
		s.tb.Fatal(err)
	}
}

// Stop kills the server and waits for it to exit.
func (s *RedisServer) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("testenv: find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// dialWait waits until addr accepts connections, for at most 30 seconds.
func dialWait(what, addr string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			return c.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testenv: %s did not come up on %s: %w", what, addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
