package main

import (
	"context"
	"fmt"
	"time"

	"github.com/urfave/cli/v3"
)

func gcCommand() *cli.Command {
	var batch int
	return &cli.Command{
		Name:  "gc",
		Usage: "delete inbox and request records whose retention ran out",
		Description: "Deletes expired records in bounded batches through the expires_at index, records under a live lease\n" +
			"kept: the inbox's, then the HTTP/gRPC request records of request/pgstore (skipped if that table was never\n" +
			"migrated). A progress line on stderr shows it is working; the counts are printed at the end.",
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "batch-size", Value: 1000, Usage: fmt.Sprintf("records per DELETE (at most %d)", gcBatchMax), Sources: cli.EnvVars("IDEMQ_GC_BATCH_SIZE"),
				Destination: &batch, Validator: func(n int) error {
					if n <= 0 || n > gcBatchMax {
						return fmt.Errorf("--batch-size %d: want 1 to %d", n, gcBatchMax)
					}
					return nil
				}},
		},
		Action: func(ctx context.Context, cmd *cli.Command) error { return runGC(ctx, cmd, batch) },
	}
}

// gcBatchMax is the largest gc --batch-size. One DELETE holds its row
// locks and writes its WAL until it ends: past 100,000 rows a batch only
// makes the pauses of concurrent writers longer (--batch-size 2147483648
// was one unbounded DELETE).
const gcBatchMax = 100_000

// runGC collects in DELETEs of batch records.
func runGC(ctx context.Context, cmd *cli.Command, batch int) error {
	// Every flag is checked before the database is reached: a bad table
	// name is a usage error (2) whether or not it answers.
	pool, err := openPool(cmd)
	if err != nil {
		return err
	}
	defer pool.Close()
	requests, err := requestStore(cmd, pool)
	if err != nil {
		return err
	}
	_, ib, err := stores(cmd, pool)
	if err != nil {
		return err
	}
	if err := ping(ctx, cmd, pool); err != nil {
		return err
	}
	// Store.GC reports only its total, so the progress line shows the time
	// spent until it returns.
	start := time.Now()
	stop := progress(cmd, start)
	n, err := ib.GC(ctx, batch)
	var r int64
	pending, perr := requests.PendingMigrations(ctx)
	if err == nil {
		err = perr
	}
	if err == nil && len(pending) == 0 {
		r, err = requests.GC(ctx, batch)
	}
	stop()
	if err != nil {
		return fmt.Errorf("gc after %v: %w", time.Since(start).Round(time.Millisecond), err)
	}
	took := time.Since(start)
	return output(cmd, map[string]any{"deleted": n, "requests_deleted": r, "seconds": took.Seconds()}, func(t *table) {
		t.note("deleted %d expired inbox records and %d expired request records in %v", n, r, took.Round(time.Millisecond))
		if len(pending) > 0 {
			t.note("request table %s is not migrated (idemq migrate --components requests): its records were not collected", globals(cmd).requestsTable)
		}
	})
}

// progress rewrites a line on stderr every second until stop is called.
func progress(cmd *cli.Command, start time.Time) (stop func()) {
	w := cmd.Root().ErrWriter
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				fmt.Fprintf(w, "\rgc: deleting expired inbox records… %v", time.Since(start).Round(time.Second))
			}
		}
	}()
	return func() {
		close(done)
		<-finished
		if time.Since(start) >= time.Second {
			fmt.Fprintln(w)
		}
	}
}
