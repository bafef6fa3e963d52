package idemqtest_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/testenv"
)

// testPaymentsAppliedOnce is a whole test in the setup pattern of the
// package documentation: its own database, t.Parallel, effects recorded in
// the handler's transaction, a wait for the background work, and an
// assertion per key.
func testPaymentsAppliedOnce(t *testing.T) {
	t.Parallel()                // the test owns its database
	pool := testenv.Postgres(t) // a fresh database, dropped at cleanup
	effects := idemqtest.NewEffects(t, pool)

	c, err := consumer.New(pool, "payments", func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		// The business write would go here, in tx; the effect commits with it.
		return effects.Record(ctx, tx, msg.ID)
	}, consumer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}

	// A broker that redelivers: pay-1 arrives three times, from three
	// goroutines at once.
	done := make(chan consumer.Result, 4)
	for _, id := range []string{"pay-1", "pay-1", "pay-2", "pay-1"} {
		go func() { done <- c.Process(t.Context(), &consumer.Message{ID: id, Payload: []byte("10.00")}) }()
	}
	settled := 0
	idemqtest.WaitFor(t, "four deliveries settled", func() bool {
		for {
			select {
			case <-done:
				settled++
			default:
				return settled == 4
			}
		}
	})
	effects.AssertOnce(t, "pay-1", "pay-2")
}

// The test above, run by go test like any other: idemqtest needs a
// *testing.T, so this example is compiled but not run by itself.
func Example() {
	var t *testing.T // the *testing.T of your test
	testPaymentsAppliedOnce(t)
}
