package migrate_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/migrate"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/testenv"
)

// A service that keeps an inbox and an outbox migrates both at deploy time
// and checks at start that nothing is pending.
func Example() {
	ctx := context.Background()
	pool, done, err := testenv.ScratchPool(ctx, "example_migrate")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer done()
	in, err := inbox.New(pool, inbox.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}
	ob, err := outbox.New(pool, outbox.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}
	m := migrate.New(pool, in, ob)

	// At start, before the deploy step ran: Validate's error matches
	// migrate.ErrPending and lists what is pending.
	var pending *migrate.PendingError
	if err := m.Validate(ctx); errors.As(err, &pending) {
		fmt.Println("pending:", len(pending.Pending))
	}

	// The deploy step.
	applied, err := m.Migrate(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, mg := range applied {
		fmt.Println("applied", mg.Component, mg.ID())
	}
	fmt.Println("current:", m.Validate(ctx) == nil)

	// Undo the outbox's last migration, then apply it again.
	undone, err := migrate.New(pool, ob).Down(ctx, 1)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("undone", undone[0].Component, undone[0].ID())
	if _, err := m.Migrate(ctx); err != nil {
		fmt.Println(err)
		return
	}
	// Output:
	// pending: 15
	// applied inbox 0001_inbox
	// applied inbox 0002_failures
	// applied inbox 0003_conflicts
	// applied inbox 0004_superseded
	// applied inbox 0005_token
	// applied inbox 0006_error_class
	// applied inbox 0007_expired_leases
	// applied outbox 0001_outbox
	// applied outbox 0002_partitions
	// applied outbox 0003_error_class
	// applied outbox 0004_audit
	// applied outbox 0005_audit_outcome
	// applied outbox 0006_dead_groups
	// applied outbox 0007_parked
	// applied outbox 0008_enqueue_function
	// current: true
	// undone outbox 0008_enqueue_function
}
