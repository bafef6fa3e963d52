package endpoints

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/pgtx"
	"github.com/idemq/idemq/outbox"
)

// DestinationPrefix starts the outbox destination of every webhook row:
// "webhook/<endpoint id>". Route it to the [Sink] with
// relay.Router.RoutePrefix.
const DestinationPrefix = "webhook/"

// Event is one business event to deliver to every endpoint subscribed to
// its type.
type Event struct {
	// Type is the event type ("invoice.paid"): dotted letters, digits and
	// underscores, as Standard Webhooks recommends.
	Type string
	// Key orders the event's deliveries: one endpoint receives the events
	// of one key in the order they were published. Empty means unordered.
	// At most MaxEventKeyLen bytes of UTF-8 text without NUL.
	Key string
	// Data is the event's JSON payload, sent as the "data" member.
	// Required.
	Data json.RawMessage
	// Timestamp is when the event happened; zero means now.
	Timestamp time.Time
}

// payload is the Standard Webhooks body.
type payload struct {
	Type      string          `json:"type"`
	Timestamp time.Time       `json:"timestamp"`
	Data      json.RawMessage `json:"data"`
}

// MaxEventKeyLen bounds Event.Key: an outbox key (outbox.MaxKeyLen) less
// the endpoint id (at most 200 bytes) and "/" that PublishTx puts before
// it.
const MaxEventKeyLen = outbox.MaxKeyLen - 201

// ErrInvalidEvent is matched by the error PublishTx returns for an event
// it refused before writing anything.
var ErrInvalidEvent = errors.New("webhook: invalid event")

// Publisher fans events out to the subscribed endpoints through the
// outbox. It is safe for concurrent use.
type Publisher struct {
	reg *Registry
	ob  *outbox.Outbox
}

// NewPublisher returns a publisher that reads subscriptions from reg and
// writes deliveries into ob.
func NewPublisher(reg *Registry, ob *outbox.Outbox) (*Publisher, error) {
	switch {
	case reg == nil:
		return nil, idemq.NewConfigError("endpoints.Publisher", "reg", "is nil: pass the Registry of the endpoints")
	case ob == nil:
		return nil, idemq.NewConfigError("endpoints.Publisher", "ob", "is nil: pass the Outbox the deliveries go through")
	}
	return &Publisher{reg: reg, ob: ob}, nil
}

// PublishTx writes, inside tx, one outbox row per event and enabled
// endpoint subscribed to the event's type, and returns how many. Each row
// is delivered, retried and dead-lettered on its own; rows of one endpoint
// and event key keep their order. The rows exist if and only if tx
// commits: a rollback publishes nothing. Disabled endpoints receive
// nothing. A nil tx is an error, and so is an event PublishTx refuses,
// whose error matches ErrInvalidEvent and names the event by its index in
// events; either way nothing is written.
func (p *Publisher) PublishTx(ctx context.Context, tx pgx.Tx, events ...Event) (int, error) {
	if pgtx.IsNil(tx) {
		return 0, idemq.NewConfigError("endpoints.Publisher", "tx", "is nil: PublishTx needs the business transaction the events belong to")
	}
	if len(events) == 0 {
		return 0, nil
	}
	bodies := make([][]byte, len(events))
	types := make([]string, 0, len(events))
	for i, ev := range events {
		if !validType(ev.Type) {
			return 0, fmt.Errorf("%w %d: type %q: want dotted letters, digits and underscores", ErrInvalidEvent, i, ev.Type)
		}
		if !json.Valid(ev.Data) {
			return 0, fmt.Errorf("%w %d: data is not JSON", ErrInvalidEvent, i)
		}
		switch {
		case len(ev.Key) > MaxEventKeyLen:
			return 0, fmt.Errorf("%w %d: key of %d bytes, limit %d", ErrInvalidEvent, i, len(ev.Key), MaxEventKeyLen)
		case !utf8.ValidString(ev.Key) || strings.IndexByte(ev.Key, 0) >= 0:
			return 0, fmt.Errorf("%w %d: key is not UTF-8 text or contains NUL", ErrInvalidEvent, i)
		}
		ts := ev.Timestamp
		if ts.IsZero() {
			ts = time.Now()
		}
		body, err := json.Marshal(payload{Type: ev.Type, Timestamp: ts.UTC(), Data: ev.Data})
		if err != nil {
			return 0, fmt.Errorf("%w %d: %v", ErrInvalidEvent, i, err)
		}
		bodies[i] = body
		if !slices.Contains(types, ev.Type) {
			types = append(types, ev.Type)
		}
	}
	rows, err := tx.Query(ctx, p.reg.sql.enabled, types)
	if err != nil {
		return 0, dbError("read subscriptions", err)
	}
	type sub struct {
		id    string
		types []string
	}
	subs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (sub, error) {
		var s sub
		return s, row.Scan(&s.id, &s.types)
	})
	if err != nil {
		return 0, dbError("read subscriptions", err)
	}
	var msgs []outbox.Message
	var eventOf []int // msgs[j] delivers events[eventOf[j]]
	for i, ev := range events {
		for _, s := range subs {
			if len(s.types) > 0 && !slices.Contains(s.types, ev.Type) {
				continue
			}
			m := outbox.Message{
				Destination: DestinationPrefix + s.id,
				Payload:     bodies[i],
				Headers:     map[string]string{"content-type": "application/json"},
			}
			if ev.Key != "" {
				// The endpoint is part of the key, so one endpoint's
				// failures never hold back another's deliveries.
				m.Key = s.id + "/" + ev.Key
			}
			msgs = append(msgs, m)
			eventOf = append(eventOf, i)
		}
	}
	if err := p.ob.EnqueueTx(ctx, tx, msgs...); err != nil {
		if invalid := (*outbox.InvalidMessageError)(nil); errors.As(err, &invalid) {
			return 0, fmt.Errorf("%w %d (its row to endpoint %s): %w", ErrInvalidEvent, eventOf[invalid.Index],
				strings.TrimPrefix(msgs[invalid.Index].Destination, DestinationPrefix), err)
		}
		return 0, err
	}
	return len(msgs), nil
}

// validType accepts dotted [a-zA-Z0-9_] segments.
func validType(t string) bool {
	if t == "" || len(t) > 200 {
		return false
	}
	for seg := range strings.SplitSeq(t, ".") {
		if seg == "" {
			return false
		}
		for _, c := range seg {
			if !(c == '_' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
				return false
			}
		}
	}
	return true
}
