package main

import (
	"context"
	"fmt"
	"time"

	"github.com/urfave/cli/v3"
)

func gcCommand() *cli.Command {
	return &cli.Command{
		Name:  "gc",
		Usage: "delete inbox records whose retention ran out",
		Description: "Deletes expired records in bounded batches through the expires_at index, records under a live lease\n" +
			"kept. A progress line on stderr shows it is working; the count is printed at the end.",
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "batch-size", Value: 1000, Usage: "records per DELETE", Sources: cli.EnvVars("IDEMQ_GC_BATCH_SIZE")},
		},
		Action: runGC,
	}
}

func runGC(ctx context.Context, cmd *cli.Command) error {
	if cmd.Int("batch-size") <= 0 {
		return usageError("--batch-size must be positive")
	}
	pool, err := connect(ctx, cmd)
	if err != nil {
		return err
	}
	defer pool.Close()
	_, ib, err := stores(cmd, pool)
	if err != nil {
		return err
	}
	// Store.GC reports only its total, so the progress line shows the time
	// spent until it returns.
	start := time.Now()
	stop := progress(cmd, start)
	n, err := ib.GC(ctx, cmd.Int("batch-size"))
	stop()
	if err != nil {
		return fmt.Errorf("gc after %v: %w", time.Since(start).Round(time.Millisecond), err)
	}
	took := time.Since(start)
	return output(cmd, map[string]any{"deleted": n, "seconds": took.Seconds()}, func(t *table) {
		t.note("deleted %d expired inbox records in %v", n, took.Round(time.Millisecond))
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
