package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultDatabaseURL is the admin connection used when IDEMQ_TEST_DATABASE_URL
// is unset: the machine's local server with trust authentication.
const DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

const postgresHelp = `start it with
	pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start
or run through make test / make demo (or go run ./testenv/withpostgres CMD), which
start a private server from the machine's Postgres binaries when none answers,
or point IDEMQ_TEST_DATABASE_URL at a server where the user may CREATE DATABASE`

// DatabaseURL returns the admin connection string tests create databases with.
func DatabaseURL() string {
	if u := os.Getenv("IDEMQ_TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultDatabaseURL
}

// Postgres creates a fresh database for tb, returns a pool on it and drops
// the database at cleanup. Tests may run in parallel: each has its own.
func Postgres(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	url := PostgresURL(tb)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		tb.Fatalf("testenv: open pool: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// PostgresURL creates a fresh database for tb, dropped at cleanup, and
// returns its connection string, for tests that open their own connections.
func PostgresURL(tb testing.TB) string {
	tb.Helper()
	url, drop, err := CreateDatabase(context.Background(), "idemq_test")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := drop(); err != nil {
			tb.Error(err)
		}
	})
	return url
}

// CreateDatabase creates a database named prefix plus a random suffix on
// the server of DatabaseURL, for examples and demos that have no
// testing.TB. It returns the database's connection string and a func that
// drops it. An unreachable server is an error that says how to start one.
func CreateDatabase(ctx context.Context, prefix string) (connString string, drop func() error, err error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, DatabaseURL())
	if err != nil {
		return "", nil, fmt.Errorf("testenv: Postgres is not reachable at %s: %w\n%s", redact(DatabaseURL()), err, postgresHelp)
	}
	defer admin.Close(context.Background())

	name := pgx.Identifier{prefix + "_" + randomSuffix()}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name.Sanitize()); err != nil {
		return "", nil, fmt.Errorf("testenv: create database: %w", err)
	}
	return withDatabase(DatabaseURL(), name[0]), func() error { return dropDatabase(name) }, nil
}

// withDatabase returns the connection string connString with its database
// replaced by name; it accepts both URLs and key=value strings.
func withDatabase(connString, name string) string {
	if u, err := url.Parse(connString); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Path = "/" + name
		return u.String()
	}
	return connString + " dbname=" + name
}

// redact hides a password in a connection URL before it reaches a log.
func redact(connString string) string {
	if u, err := url.Parse(connString); err == nil && u.Scheme != "" {
		return u.Redacted()
	}
	return "the configured server"
}

// ScratchPool is [CreateDatabase] with a pool on the new database, for
// Examples and programs without a testing.TB; done closes the pool and
// drops the database.
func ScratchPool(ctx context.Context, prefix string) (pool *pgxpool.Pool, done func(), err error) {
	connString, drop, err := CreateDatabase(ctx, prefix)
	if err != nil {
		return nil, nil, err
	}
	pool, err = pgxpool.New(ctx, connString)
	if err != nil {
		return nil, nil, errors.Join(err, drop())
	}
	return pool, func() { pool.Close(); _ = drop() }, nil
}

func dropDatabase(name pgx.Identifier) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, DatabaseURL())
	if err == nil {
		defer admin.Close(context.Background())
		_, err = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name.Sanitize()+" WITH (FORCE)")
	}
	if err != nil {
		return fmt.Errorf("testenv: drop database %s: %w", name[0], err)
	}
	return nil
}

func randomSuffix() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
