package idemwatermill

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
)

// Defaults of [SubscriberConfig].
const (
	NackDelayDefault        = 100 * time.Millisecond
	UnsubscribedHoldDefault = time.Second
)

// ErrSubscriberClosed is returned by Subscribe after Close.
var ErrSubscriberClosed = errors.New("idemwatermill: subscriber closed")

// SubscriberConfig configures a [Subscriber]. Zero values mean the
// documented defaults.
type SubscriberConfig struct {
	// Relay configures the relay that feeds the subscriptions. Its
	// PublishTimeout (30 seconds by default) bounds the time from handing
	// a batch's first message to a subscription to the last Ack: messages
	// not acked by then come back after NackDelay, in a new batch. With
	// slow handlers, a smaller BatchSize (500 by default) keeps a batch
	// within it.
	Relay relay.Config
	// NackDelay is how long a Nacked message, and the later messages of its
	// key, wait before they are delivered again. Defaults to 100 ms.
	NackDelay time.Duration
	// UnsubscribedHold is how long a message of a topic without a
	// subscription in this Subscriber waits before the relay tries it
	// again; a Subscribe to its topic brings it back at once. Defaults to
	// 1 second.
	UnsubscribedHold time.Duration
}

// Subscriber hands the rows of an outbox to Watermill subscriptions through
// a relay of its own, which runs from the first Subscribe to Close. See
// the package documentation for what it guarantees.
type Subscriber struct {
	pool *pgxpool.Pool
	ob   *outbox.Outbox
	cfg  SubscriberConfig
	// closing is cancelled by Close: it ends the relay and every
	// subscription and message context.
	closing context.Context
	close   context.CancelFunc

	mu     sync.Mutex
	topics map[string]*topic
	relay  chan error // Run's result, nil before the first Subscribe
	subs   sync.WaitGroup
}

// topic is the subscriptions of one topic, which take its messages in turn.
type topic struct {
	subs []*subscription
	next int
}

type subscription struct {
	ctx context.Context // the Subscribe context, ended by Close too
	out chan *message.Message
	// sending counts deliveries under way; out is closed after they end.
	sending sync.WaitGroup
}

// NewSubscriber returns a Subscriber on ob, claiming its rows on pool. It
// starts nothing until the first Subscribe.
func NewSubscriber(pool *pgxpool.Pool, ob *outbox.Outbox, cfg SubscriberConfig) (*Subscriber, error) {
	switch {
	case pool == nil:
		return nil, idemq.NewConfigError("idemwatermill.Subscriber", "pool", "is nil")
	case ob == nil:
		return nil, idemq.NewConfigError("idemwatermill.Subscriber", "outbox", "is nil")
	case cfg.NackDelay < 0:
		return nil, idemq.NewConfigError("idemwatermill.Subscriber", "NackDelay", "%v is negative", cfg.NackDelay)
	case cfg.UnsubscribedHold < 0:
		return nil, idemq.NewConfigError("idemwatermill.Subscriber", "UnsubscribedHold", "%v is negative", cfg.UnsubscribedHold)
	}
	cfg.NackDelay = cmp.Or(cfg.NackDelay, NackDelayDefault)
	cfg.UnsubscribedHold = cmp.Or(cfg.UnsubscribedHold, UnsubscribedHoldDefault)
	s := &Subscriber{pool: pool, ob: ob, cfg: cfg, topics: map[string]*topic{}}
	// Validate the relay's configuration now, not at the first Subscribe.
	if _, err := relay.New(pool, ob, s, cfg.Relay); err != nil {
		return nil, err
	}
	s.closing, s.close = context.WithCancel(context.Background())
	return s, nil
}

// Subscribe returns the messages of topic until ctx is done or the
// Subscriber is closed; then the channel is closed, and a message handed
// out and not acked comes back after NackDelay. Each message must be acked
// or nacked before the subscription gets the next one. Messages of topic
// held while nobody subscribed come back at once.
func (s *Subscriber) Subscribe(ctx context.Context, name string) (<-chan *message.Message, error) {
	sub := &subscription{out: make(chan *message.Message)}
	var cancel context.CancelFunc
	sub.ctx, cancel = context.WithCancel(ctx)
	stop := context.AfterFunc(s.closing, cancel)

	s.mu.Lock()
	if s.closing.Err() != nil {
		s.mu.Unlock()
		stop()
		cancel()
		return nil, ErrSubscriberClosed
	}
	if s.relay == nil {
		if err := s.startRelay(ctx); err != nil {
			s.mu.Unlock()
			stop()
			cancel()
			return nil, err
		}
	}
	t := s.topics[name]
	if t == nil {
		t = &topic{}
		s.topics[name] = t
	}
	t.subs = append(t.subs, sub)
	s.subs.Add(1)
	s.mu.Unlock()

	go func() {
		defer s.subs.Done()
		<-sub.ctx.Done()
		stop()
		s.mu.Lock()
		t.subs = removeSub(t.subs, sub)
		if len(t.subs) == 0 && s.topics[name] == t {
			delete(s.topics, name)
		}
		s.mu.Unlock()
		sub.sending.Wait()
		close(sub.out)
	}()
	if _, err := s.ob.RetryNow(ctx, name); err != nil && ctx.Err() == nil {
		cancel()
		return nil, fmt.Errorf("idemwatermill: subscribe to %s: %w", name, err)
	}
	return sub.out, nil
}

func removeSub(subs []*subscription, sub *subscription) []*subscription {
	for i, x := range subs {
		if x == sub {
			return append(subs[:i:i], subs[i+1:]...)
		}
	}
	return subs
}

// startRelay runs the relay until Close, once the outbox's tables are
// there; s.mu is held.
func (s *Subscriber) startRelay(ctx context.Context) error {
	pending, err := s.ob.PendingMigrations(ctx)
	if err != nil {
		return fmt.Errorf("idemwatermill: subscribe: %w", err)
	}
	if len(pending) > 0 {
		return fmt.Errorf("idemwatermill: subscribe: the outbox's tables lack %d migrations: run outbox.Outbox.Migrate or idemq migrate", len(pending))
	}
	r, err := relay.New(s.pool, s.ob, s, s.cfg.Relay)
	if err != nil {
		return err
	}
	s.relay = make(chan error, 1)
	go func() {
		err := r.Run(s.closing)
		if errors.Is(err, context.Canceled) { // closed while it started
			err = nil
		}
		s.relay <- err
	}()
	return nil
}

// Close ends every subscription, closing their channels, stops the relay
// (a message handed out and not acked comes back after NackDelay) and
// returns the relay's error, if it failed (its tables missing, say).
func (s *Subscriber) Close() error {
	s.mu.Lock()
	s.close()
	run := s.relay
	s.mu.Unlock()
	s.subs.Wait()
	if run == nil {
		return nil
	}
	err := <-run
	run <- err // a second Close returns the same
	return err
}

// Publish implements relay.Sink: it hands each message of batch to a
// subscription of its topic and reports it delivered once acked. Topics
// are served concurrently, the messages of one topic one after the other,
// in batch order.
func (s *Subscriber) Publish(ctx context.Context, _ relay.BatchID, batch []relay.Message) error {
	f := relay.NewFailures(batch)
	for _, round := range relay.Rounds(batch, func(m *relay.Message) string { return m.Destination }) {
		byTopic := map[string][]int{}
		for _, i := range round {
			if !f.Skip(i) {
				byTopic[batch[i].Destination] = append(byTopic[batch[i].Destination], i)
			}
		}
		var mu sync.Mutex
		failed := map[int]error{}
		var wg sync.WaitGroup
		for _, index := range byTopic {
			wg.Go(func() {
				stuck := map[string]bool{} // keys with a failed message in this round
				for _, i := range index {
					m := &batch[i]
					err := relay.ErrSkipped
					if m.Key == "" || !stuck[m.Key] {
						err = s.deliver(ctx, m)
					}
					if err != nil {
						stuck[m.Key] = m.Key != ""
						mu.Lock()
						failed[i] = err
						mu.Unlock()
					}
				}
			})
		}
		wg.Wait()
		for i, err := range failed {
			f.Fail(i, err)
		}
	}
	return f.Err(ctx)
}

// hold is the error of a message not delivered now: it comes back after d
// without counting an attempt.
func hold(d time.Duration, format string, args ...any) error {
	return idemq.RetryAfter(fmt.Errorf("idemwatermill: %s: %w", fmt.Sprintf(format, args...), relay.ErrSkipped), d)
}

// deliver hands m to a subscription of its topic and waits for its Ack.
func (s *Subscriber) deliver(ctx context.Context, m *relay.Message) error {
	sub := s.pick(m.Destination)
	if sub == nil {
		return hold(s.cfg.UnsubscribedHold, "no subscription to topic %q", m.Destination)
	}
	defer sub.sending.Done()
	msg := toWatermill(m)
	msgCtx, cancel := context.WithCancel(sub.ctx)
	defer cancel()
	msg.SetContext(msgCtx)
	select {
	case sub.out <- msg:
	case <-sub.ctx.Done():
		return hold(0, "subscription to %q ended", m.Destination)
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-msg.Acked():
		return nil
	case <-msg.Nacked():
		return hold(s.cfg.NackDelay, "nacked")
	case <-sub.ctx.Done():
		return hold(s.cfg.NackDelay, "subscription to %q ended before an ack", m.Destination)
	case <-ctx.Done():
		return hold(s.cfg.NackDelay, "not acked within the relay's PublishTimeout")
	}
}

// pick returns the next live subscription of name, counted in its
// sending group, or nil.
func (s *Subscriber) pick(name string) *subscription {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.topics[name]
	if t == nil || len(t.subs) == 0 {
		return nil
	}
	t.next = (t.next + 1) % len(t.subs)
	sub := t.subs[t.next]
	sub.sending.Add(1)
	return sub
}

// toWatermill is the message of an outbox row: its UUID from UUIDHeader
// or the row's id, the other headers as metadata.
func toWatermill(m *relay.Message) *message.Message {
	id := m.ID.String()
	md := message.Metadata{}
	maps.Copy(md, m.Headers)
	if v, ok := md[UUIDHeader]; ok {
		id = v
		delete(md, UUIDHeader)
	}
	msg := message.NewMessage(id, m.Payload)
	msg.Metadata = md
	return msg
}
