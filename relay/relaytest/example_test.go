package relaytest_test

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/relay/relaytest"
)

// A Sink's test builds a fresh Target per subtest: the Sink, two
// destinations only this Target publishes to, one destination the Sink
// fails, and a reader of what arrived. Here the Sink is a Router over
// in-memory sinks; a transport passes its own Sink, topics or subjects
// named after the test, and a reader of the broker.
func ExampleTestSink() {
	_ = func(t *testing.T) {
		relaytest.TestSink(t, func(t *testing.T) relaytest.Target {
			var mu sync.Mutex
			got := map[string][]relay.Message{}
			record := func(dest string) relay.Sink {
				return relay.SinkFunc(func(ctx context.Context, _ relay.BatchID, batch []relay.Message) error {
					if err := ctx.Err(); err != nil {
						return err
					}
					mu.Lock()
					defer mu.Unlock()
					got[dest] = append(got[dest], batch...)
					return nil
				})
			}
			var r relay.Router
			_ = r.Route("orders", record("orders"))
			_ = r.Route("invoices", record("invoices"))
			// "nowhere" has no route: the Router fails it with ErrNoRoute.
			return relaytest.Target{
				Sink:         &r,
				Destinations: []string{"orders", "invoices"},
				Failing:      "nowhere",
				// Received may return before n arrived here: the in-memory
				// sinks deliver before Publish returns.
				Received: func(ctx context.Context, dest string, n int) ([]relay.Message, error) {
					mu.Lock()
					defer mu.Unlock()
					return slices.Clone(got[dest]), nil
				},
			}
		})
	}
}
