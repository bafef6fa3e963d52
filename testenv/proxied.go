package testenv

import (
	"context"
	"net"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// PostgresBehindProxy creates a fresh database for tb (dropped at
// cleanup) and returns a pool whose connections go through a [Proxy] in
// front of the server, for database outage tests: proxy.Cut closes every
// connection and each new one, as a dead server or pooler would;
// proxy.Restore brings the database back. The pool is closed at cleanup.
func PostgresBehindProxy(tb testing.TB) (*pgxpool.Pool, *Proxy) {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(PostgresURL(tb))
	if err != nil {
		tb.Fatal(err)
	}
	proxy := NewProxy(tb, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	host, port, _ := net.SplitHostPort(proxy.Addr())
	p, _ := strconv.Atoi(port)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return pool, proxy
}
