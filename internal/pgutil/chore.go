package pgutil

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemq/idemq"
)

// Chore makes a maintenance chore of run on db that runs only while it
// holds the transaction-scoped advisory lock of name (hashed by the
// server), taken with pg_try_advisory_xact_lock in a transaction of its
// own: of the processes that run the chore of one name on one database,
// one does a round and the others return 0 at once. run works on db's
// other connections (DETACH … CONCURRENTLY cannot run in a transaction);
// the lock's transaction stays idle meanwhile, takes no table lock and
// ends, releasing the lock, when run returns or its process dies.
func Chore(db DB, name string, every time.Duration, run func(ctx context.Context) (int64, error)) idemq.Chore {
	return idemq.Chore{Name: name, Every: every, Run: func(ctx context.Context) (n int64, err error) {
		tx, err := db.Begin(ctx)
		if err != nil {
			return 0, fmt.Errorf("%s: lock: %w", name, err)
		}
		defer func() { err = errors.Join(err, tx.Rollback(context.WithoutCancel(ctx))) }()
		var held bool
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(hashtextextended('idemq maintenance: ' || $1, 0))`, name).Scan(&held); err != nil {
			return 0, fmt.Errorf("%s: lock: %w", name, err)
		}
		if !held {
			return 0, nil
		}
		return run(ctx)
	}}
}

// UntilDone makes a chore's round of step, a batched call that returns
// how much its batch did (ClassifyDead): it calls step with the default
// batch until a batch does nothing, and returns the total.
func UntilDone(step func(ctx context.Context, batch int) (int64, error)) func(context.Context) (int64, error) {
	return func(ctx context.Context) (int64, error) {
		var total int64
		for {
			n, err := step(ctx, 0)
			if total += n; err != nil || n == 0 {
				return total, err
			}
		}
	}
}
