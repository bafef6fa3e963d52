package idemq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Chore is one periodic task of a [Maintenance] service: inbox GC and
// partition creation, dead-letter classification, request-record GC. The
// stores make their own (inbox.Store.Chores, outbox.Outbox.Chores,
// pgstore.Store.Chores), each run under a transaction-scoped advisory lock
// of its name, so that however many processes run the same chore, one at
// a time does the work and the others skip that round.
type Chore struct {
	// Name says what the chore does and on which table; it is the
	// advisory lock's name and appears in logs.
	Name string
	// Every is the time between two runs; a partitioned inbox's GC must
	// run at least once per PartitionInterval, and its chore says so.
	Every time.Duration
	// Run does one round and returns how much it did (records deleted,
	// dead letters classified), 0 when another process holds the chore.
	Run func(ctx context.Context) (int64, error)
}

// Maintenance runs chores on their intervals, for as long as its Run
// runs: the chores every deployment needs and none should have to
// schedule (River runs its cleaners the same way, inside the client). A
// failed round is logged and tried again at the next interval; it never
// ends Run. It is a [Service]: start it with [Start] beside a consumer or
// a relay, in as many processes as run them.
type Maintenance struct {
	chores    []Chore
	logger    *slog.Logger
	ready     chan struct{}
	readyOnce sync.Once
	running   atomic.Bool
}

// NewMaintenance returns the service of chores, logging to logger
// (slog.Default() when nil). Chores need distinct names, a positive
// Every and a Run.
func NewMaintenance(logger *slog.Logger, chores ...Chore) (*Maintenance, error) {
	seen := map[string]bool{}
	for i, c := range chores {
		field := fmt.Sprintf("chores[%d]", i)
		switch {
		case c.Name == "":
			return nil, NewConfigError("maintenance", field+".Name", "is empty")
		case seen[c.Name]:
			return nil, NewConfigError("maintenance", field+".Name", "%q is given twice", c.Name)
		case c.Every <= 0:
			return nil, NewConfigError("maintenance", field+".Every", "%v is not positive", c.Every)
		case c.Run == nil:
			return nil, NewConfigError("maintenance", field+".Run", "is nil")
		}
		seen[c.Name] = true
	}
	return &Maintenance{chores: chores, logger: cmp.Or(logger, slog.Default()), ready: make(chan struct{})}, nil
}

// Ready implements [Service]: it is closed once Run has started.
func (m *Maintenance) Ready() <-chan struct{} { return m.ready }

// Run implements [Service]: it runs every chore at once, then each again
// after its Every (with up to a tenth of it added at random, so that
// processes started together spread out), until ctx is done; a round in
// flight is cancelled then. It returns nil, or [ErrRunning] while another
// Run of m is active.
func (m *Maintenance) Run(ctx context.Context) error {
	if !m.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer m.running.Store(false)
	m.readyOnce.Do(func() { close(m.ready) })
	done := make(chan struct{}, len(m.chores))
	for _, c := range m.chores {
		go func() {
			defer func() { done <- struct{}{} }()
			for {
				m.round(ctx, c)
				t := time.NewTimer(c.Every + rand.N(c.Every/10+1))
				select {
				case <-ctx.Done():
					t.Stop()
					return
				case <-t.C:
				}
			}
		}()
	}
	for range m.chores {
		<-done
	}
	return nil
}

// round runs c once and logs what it did or why it failed.
func (m *Maintenance) round(ctx context.Context, c Chore) {
	start := time.Now()
	n, err := c.Run(ctx)
	switch {
	case ctx.Err() != nil:
	case err != nil:
		m.logger.LogAttrs(ctx, slog.LevelWarn, "maintenance chore failed; trying again at its next interval",
			slog.String("chore", c.Name), slog.String("next_in", c.Every.String()), slog.Any("error", err))
	case n > 0:
		m.logger.LogAttrs(ctx, slog.LevelInfo, "maintenance chore done", slog.String("chore", c.Name),
			slog.Int64("done", n), slog.String("took", time.Since(start).Round(time.Millisecond).String()))
	}
}

// ChoreResult is what one chore did in a [Maintenance.RunOnce] pass.
type ChoreResult struct {
	Name string
	// Done is how much it did (see [Chore.Run]).
	Done int64
	Err  error
}

// RunOnce runs every chore once, one after the other, and returns what
// each did and the errors joined: the single pass of `idemq gc`.
func (m *Maintenance) RunOnce(ctx context.Context) ([]ChoreResult, error) {
	out := make([]ChoreResult, len(m.chores))
	var errs []error
	for i, c := range m.chores {
		n, err := c.Run(ctx)
		out[i] = ChoreResult{Name: c.Name, Done: n, Err: err}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", c.Name, err))
		}
	}
	return out, errors.Join(errs...)
}
