package fleet

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"unicode"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemq/idemq"
)

// Database is one database of a fleet: a name the operator chose (a
// tenant or shard id, unique in the fleet) and how to connect to it.
type Database struct {
	Name       string
	ConnString string
}

// Server returns the address of the server d lives on, host:port of the
// connection string's first host: the unit a [Budget] counts against.
func (d Database) Server() (string, error) {
	cfg, err := pgconn.ParseConfig(d.ConnString)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s:%d", cfg.Host, cfg.Port), nil
}

// dbname returns the database name d connects to on its server.
func (d Database) dbname() (string, error) {
	cfg, err := pgconn.ParseConfig(d.ConnString)
	if err != nil {
		return "", err
	}
	return cfg.Database, nil
}

// A Source lists the databases of a fleet. It is read when a fleet starts
// and again while it runs, so a database it adds is picked up and one it
// drops is released without a restart.
type Source interface {
	Databases(ctx context.Context) ([]Database, error)
}

// SourceFunc adapts a func to a [Source].
type SourceFunc func(ctx context.Context) ([]Database, error)

// Databases calls f.
func (f SourceFunc) Databases(ctx context.Context) ([]Database, error) { return f(ctx) }

// Static is a fixed list of databases.
func Static(dbs ...Database) Source {
	return SourceFunc(func(context.Context) ([]Database, error) { return Check(dbs) })
}

// File reads the databases from a text file, one per line: the name, blanks,
// then the connection string (a URL or key=value pairs, which may hold
// blanks). Blank lines and lines starting with # are skipped. The file is
// read again at each reload, so editing it adds and removes databases.
func File(path string) Source {
	return SourceFunc(func(context.Context) ([]Database, error) {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("fleet: read the databases: %w", err)
		}
		var dbs []Database
		sc := bufio.NewScanner(bytes.NewReader(data))
		for n := 1; sc.Scan(); n++ {
			line := strings.TrimSpace(sc.Text())
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			i := strings.IndexFunc(line, unicode.IsSpace)
			if i < 0 {
				return nil, fmt.Errorf("fleet: %s:%d: want NAME CONNSTRING", path, n)
			}
			name, conn := line[:i], strings.TrimSpace(line[i:])
			if conn == "" {
				return nil, fmt.Errorf("fleet: %s:%d: want NAME CONNSTRING", path, n)
			}
			dbs = append(dbs, Database{Name: name, ConnString: conn})
		}
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("fleet: read the databases: %w", err)
		}
		return Check(dbs)
	})
}

// Querier runs a query: a *pgxpool.Pool or a *pgx.Conn on the catalog
// database.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Query lists the databases with a query on a catalog database whose rows
// are (name text, connection string text), for example
// "SELECT tenant_id, dsn FROM tenants WHERE active".
func Query(db Querier, sql string) Source {
	return SourceFunc(func(ctx context.Context) ([]Database, error) {
		rows, err := db.Query(ctx, sql)
		if err != nil {
			return nil, fmt.Errorf("fleet: list the databases: %w", err)
		}
		dbs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Database, error) {
			var d Database
			err := row.Scan(&d.Name, &d.ConnString)
			return d, err
		})
		if err != nil {
			return nil, fmt.Errorf("fleet: list the databases (want rows of name text, connection string text): %w", err)
		}
		return Check(dbs)
	})
}

// Check validates a list of databases: every name set and unique, every
// connection string valid, and no database listed twice under two names
// (it would be drained by two relays counted as two, and its connections
// counted twice against the budget). It returns dbs.
func Check(dbs []Database) ([]Database, error) {
	names := make(map[string]bool, len(dbs))
	places := make(map[string]string, len(dbs))
	for _, d := range dbs {
		if d.Name == "" || strings.TrimSpace(d.Name) != d.Name {
			return nil, idemq.NewConfigError("fleet", "database name", "%q is empty or has surrounding blanks", d.Name)
		}
		if names[d.Name] {
			return nil, idemq.NewConfigError("fleet", "database name", "%q is listed twice", d.Name)
		}
		names[d.Name] = true
		server, err := d.Server()
		if err != nil {
			return nil, idemq.NewConfigError("fleet", "connection string", "of %q: %v", d.Name, err)
		}
		dbname, _ := d.dbname()
		place := server + "/" + dbname
		if other, ok := places[place]; ok {
			return nil, idemq.NewConfigError("fleet", "connection string", "of %q names the database of %q (%s) again", d.Name, other, place)
		}
		places[place] = d.Name
	}
	return dbs, nil
}
