package fleet

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Result is what [Each] did on one database.
type Result struct {
	Database Database
	Err      error
	Took     time.Duration
}

// Each runs fn on every database of dbs, at most concurrency at a time,
// each on a connection of its own closed after fn returned; a failure
// does not stop the others. The results are in the order of dbs. It is
// the one-shot form of fleet work: migrating or validating every
// database at a deploy, reading every database's backlog.
func Each(ctx context.Context, dbs []Database, concurrency int, fn func(ctx context.Context, db Database, conn *pgx.Conn) error) []Result {
	results := make([]Result, len(dbs))
	slots := make(chan struct{}, max(concurrency, 1))
	var wg sync.WaitGroup
	for i, d := range dbs {
		results[i].Database = d
		wg.Go(func() {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				results[i].Err = ctx.Err()
				return
			}
			defer func() { <-slots }()
			start := time.Now()
			conn, err := pgx.Connect(ctx, d.ConnString)
			if err == nil {
				err = fn(ctx, d, conn)
				_ = conn.Close(context.WithoutCancel(ctx))
			}
			results[i].Err, results[i].Took = err, time.Since(start)
		})
	}
	wg.Wait()
	return results
}
