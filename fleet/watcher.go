package fleet

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Watcher tells which databases of one server saw writes since it last
// looked, from the server's statistics (pg_stat_database's tup_inserted):
// one query on one connection per server, however many databases, where a
// LISTEN per database would hold a connection each. Postgres publishes a
// session's counts when the session goes idle, at most once a second, and
// within 10 seconds of its last transaction when it stays idle (Postgres
// 15's PGSTAT_MIN_INTERVAL and PGSTAT_IDLE_INTERVAL): that bounds how late
// a change is seen. A change is a hint, never proof: the caller checks the
// database itself, and also visits every database now and then in case
// the statistics were reset or lost.
type Watcher struct {
	server string
	conn   *pgx.Conn
	last   map[string]int64 // database name -> tup_inserted last seen
}

// NewWatcher returns a watcher of server (host:port, as
// [Database.Server] gives it). It connects at its first Changed.
func NewWatcher(server string) *Watcher {
	return &Watcher{server: server, last: map[string]int64{}}
}

// Changed returns the databases among dbs (all on the watcher's server)
// whose counts moved since the last call, and every database it has not
// seen before. It connects, or connects again after a failure, through
// the first of dbs that answers.
func (w *Watcher) Changed(ctx context.Context, dbs []Database) ([]Database, error) {
	if w.conn == nil || w.conn.IsClosed() {
		if err := w.connect(ctx, dbs); err != nil {
			return nil, err
		}
	}
	names := make([]string, len(dbs))
	for i, d := range dbs {
		names[i], _ = d.dbname()
	}
	rows, err := w.conn.Query(ctx, `SELECT datname, tup_inserted FROM pg_stat_database WHERE datname = ANY($1)`, names)
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("fleet: read the statistics of %s: %w", w.server, err)
	}
	counts := map[string]int64{}
	var name string
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&name, &n}, func() error { counts[name] = n; return nil }); err != nil {
		w.Close()
		return nil, fmt.Errorf("fleet: read the statistics of %s: %w", w.server, err)
	}
	var changed []Database
	for i, d := range dbs {
		now, ok := counts[names[i]]
		before, seen := w.last[names[i]]
		if !ok || !seen || now != before {
			changed = append(changed, d)
		}
		if ok {
			w.last[names[i]] = now
		} else {
			delete(w.last, names[i]) // dropped, or never had a session
		}
	}
	return changed, nil
}

// Forget makes the next Changed report d whatever its counts.
func (w *Watcher) Forget(d Database) {
	name, _ := d.dbname()
	delete(w.last, name)
}

func (w *Watcher) connect(ctx context.Context, dbs []Database) error {
	var errs []error
	for _, d := range dbs {
		conn, err := pgx.Connect(ctx, d.ConnString)
		if err == nil {
			w.conn = conn
			return nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return fmt.Errorf("fleet: no database of %s answers: %w", w.server, errors.Join(errs...))
}

// Close closes the watcher's connection, if any.
func (w *Watcher) Close() {
	if w.conn != nil {
		_ = w.conn.Close(context.Background())
		w.conn = nil
	}
}
