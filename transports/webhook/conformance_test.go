package webhook_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/relay/relaytest"
	"github.com/idemq/idemq/transports/webhook"
	"github.com/idemq/idemq/transports/webhook/endpoints"
)

// TestSinkConformance runs the relay's Sink suite against the webhook Sink
// and real receivers. The ordering key does not travel in a webhook, so
// the target remembers the key of every id it was asked to publish.
func TestSinkConformance(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sink := fastSink(t, b, webhook.Config{})
	relaytest.TestSink(t, func(t *testing.T) relaytest.Target {
		var mu sync.Mutex
		keys := map[uuid.UUID]string{}
		recorded := relay.SinkFunc(func(ctx context.Context, id relay.BatchID, batch []relay.Message) error {
			mu.Lock()
			for _, m := range batch {
				keys[m.ID] = m.Key
			}
			mu.Unlock()
			return sink.Publish(ctx, id, batch)
		})
		receivers := map[string]*receiver{}
		var dests []string
		for range 2 {
			rc := newReceiver(t, nil)
			ep, _ := addEndpoint(t, b, rc.srv.URL, nil)
			dests = append(dests, endpoints.DestinationPrefix+ep.ID)
			receivers[dests[len(dests)-1]] = rc
		}
		bad := newReceiver(t, func(_ int, w http.ResponseWriter, _ *http.Request) bool {
			http.Error(w, "no", http.StatusBadRequest)
			return true
		})
		failing, _ := addEndpoint(t, b, bad.srv.URL, nil)
		return relaytest.Target{
			Sink:         recorded,
			Destinations: dests,
			Failing:      endpoints.DestinationPrefix + failing.ID,
			Received: func(ctx context.Context, dest string, n int) ([]relay.Message, error) {
				rc := receivers[dest]
				for rc.count() < n {
					select {
					case <-ctx.Done():
						return nil, ctx.Err()
					case <-time.After(5 * time.Millisecond):
					}
				}
				var out []relay.Message
				mu.Lock()
				defer mu.Unlock()
				for _, h := range rc.all() {
					id, err := uuid.Parse(h.id)
					if err != nil {
						return nil, err
					}
					headers := map[string]string{}
					for name, v := range h.header {
						headers[name] = v[0]
					}
					out = append(out, relay.Message{Message: outbox.Message{ID: id, Destination: dest, Key: keys[id], Payload: h.body, Headers: headers}})
				}
				return out, nil
			},
		}
	})
}
