package webhook

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/lifecycle"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/transports/webhook/endpoints"
)

// Defaults of [Config].
const (
	TimeoutDefault         = 15 * time.Second
	ConcurrencyDefault     = 8
	MaxResponseBodyDefault = 64 << 10
	ErrorBodyDefault       = 512
	DisableAfterDefault    = 5 * 24 * time.Hour
	MaxRetryAfterDefault   = time.Hour
	BreakerFailuresDefault = 5
	BreakerCooldownDefault = 5 * time.Second
	HoldIntervalDefault    = time.Minute
	RefreshIntervalDefault = 5 * time.Second
	UserAgentDefault       = "idemq-webhook/1"
)

// Config configures a [Sink]. Zero values mean the documented defaults.
type Config struct {
	// Timeout bounds one delivery (connect, send, response headers and
	// body) unless the endpoint sets its own. Keep it below the relay's
	// PublishTimeout. Defaults to 15 seconds.
	Timeout time.Duration
	// Concurrency bounds the deliveries in flight to one endpoint unless
	// the endpoint sets its own. Defaults to 8.
	Concurrency int
	// MaxResponseBody is how much of a response body is read (and then
	// dropped); the rest is discarded with the connection. Defaults to 64 KiB.
	MaxResponseBody int
	// ErrorBody is how many first bytes of a failed delivery's response
	// body are kept in its error, which the relay stores with the retry or
	// dead letter. Defaults to 512.
	ErrorBody int
	// DisableAfter disables an endpoint whose deliveries have failed,
	// without a success, for this long. Defaults to 5 days.
	DisableAfter time.Duration
	// MaxRetryAfter bounds how long a receiver's Retry-After may delay a
	// retry. Defaults to 1 hour.
	MaxRetryAfter time.Duration
	// BreakerFailures consecutive retryable failures (5xx, 429, timeouts,
	// connection errors) open an endpoint's breaker: its rows are held,
	// without burning attempts, for BreakerCooldown, then one delivery
	// probes it. Defaults to 5.
	BreakerFailures int
	// BreakerCooldown is how long an open breaker holds the endpoint's
	// rows: they come back when it half-opens, and the first of them
	// probes the endpoint while the others wait (a second at most, or the
	// cooldown if shorter) for its answer. It doubles with every failed
	// probe, up to 64 times its value (5m20s on the default), until a
	// delivery succeeds. Deliveries already in flight when the breaker
	// opened do not stretch it. So an outage shorter than the cooldown
	// delays the endpoint's rows by about one cooldown. Defaults to 5
	// seconds.
	BreakerCooldown time.Duration
	// HoldInterval is how often the rows of a disabled endpoint come back
	// to see whether it was re-enabled: each time the relay claims and puts
	// back the head of every held key and every held unkeyed row. After
	// [endpoints.Registry.Enable], Outbox.RetryNow on the endpoint's destination
	// sends them at once. Defaults to 1 minute.
	HoldInterval time.Duration
	// RefreshInterval is how long the Sink trusts its copy of an endpoint
	// (URL, keys, enabled state, limits) before reading it again. Defaults
	// to 5 seconds.
	RefreshInterval time.Duration
	// AllowedNetworks are exempt from the SSRF guard. By default every
	// loopback, private, link-local, shared, documentation and other
	// special-purpose address (and the cloud metadata address among them)
	// is refused at connect time, after DNS resolution, on every
	// connection. Tests allow 127.0.0.0/8 and ::1/128.
	AllowedNetworks []netip.Prefix
	// UserAgent is sent with every delivery. Defaults to "idemq-webhook/1".
	UserAgent string
	// Instance names this Sink where it reports its breakers' changes
	// ([endpoints.Endpoint].BreakerRelay). Defaults to "<hostname>/<pid>".
	Instance string
	// Hooks receive delivery events. All optional.
	Hooks Hooks
	// Logger receives endpoint state changes, breaker changes among them,
	// which the Sink also records in the registry ([endpoints.Endpoint].Breaker).
	// Defaults to slog.Default().
	Logger *slog.Logger
}

// Hooks are optional callbacks. They run on the Sink's goroutines and must
// be quick and safe for concurrent use.
type Hooks struct {
	// OnDelivered is called after a 2xx.
	OnDelivered func(DeliveredEvent)
	// OnFailed is called after a delivery that did not get a 2xx.
	OnFailed func(FailedEvent)
	// OnDisabled is called when the Sink disables an endpoint.
	OnDisabled func(DisabledEvent)
}

// DeliveredEvent describes a successful delivery.
type DeliveredEvent struct {
	// Endpoint is the endpoint's id.
	Endpoint string
	// Message is the outbox row delivered.
	Message relay.Message
	// Status is the 2xx the endpoint answered.
	Status int
	// Took is the time from sending the request to reading the response.
	Took time.Duration
}

// FailedEvent describes a delivery that did not get a 2xx.
type FailedEvent struct {
	// Endpoint is the endpoint's id.
	Endpoint string
	// Message is the outbox row that failed.
	Message relay.Message
	// Err wraps a *[DeliveryError].
	Err error
	// Took is the time from sending the request to the failure.
	Took time.Duration
}

// DisabledEvent reports an endpoint the Sink disabled.
type DisabledEvent struct {
	// Endpoint is the endpoint's id.
	Endpoint string
	// Reason is stored as the endpoint's DisabledReason.
	Reason string
}

func (c Config) withDefaults() Config {
	c.Timeout = cmp.Or(c.Timeout, TimeoutDefault)
	c.Concurrency = cmp.Or(c.Concurrency, ConcurrencyDefault)
	c.MaxResponseBody = cmp.Or(c.MaxResponseBody, MaxResponseBodyDefault)
	c.ErrorBody = cmp.Or(c.ErrorBody, ErrorBodyDefault)
	c.DisableAfter = cmp.Or(c.DisableAfter, DisableAfterDefault)
	c.MaxRetryAfter = cmp.Or(c.MaxRetryAfter, MaxRetryAfterDefault)
	c.BreakerFailures = cmp.Or(c.BreakerFailures, BreakerFailuresDefault)
	c.BreakerCooldown = cmp.Or(c.BreakerCooldown, BreakerCooldownDefault)
	c.HoldInterval = cmp.Or(c.HoldInterval, HoldIntervalDefault)
	c.RefreshInterval = cmp.Or(c.RefreshInterval, RefreshIntervalDefault)
	c.UserAgent = cmp.Or(c.UserAgent, UserAgentDefault)
	if c.Instance == "" {
		host, _ := os.Hostname()
		c.Instance = cmp.Or(host, "unknown") + "/" + strconv.Itoa(os.Getpid())
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	const component = "webhook.Sink"
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"Timeout", c.Timeout}, {"DisableAfter", c.DisableAfter}, {"MaxRetryAfter", c.MaxRetryAfter},
		{"BreakerCooldown", c.BreakerCooldown}, {"HoldInterval", c.HoldInterval}, {"RefreshInterval", c.RefreshInterval}} {
		if d.v < 0 {
			return idemq.NewConfigError(component, d.name, "%v is negative", d.v)
		}
	}
	for _, n := range []struct {
		name string
		v    int
	}{{"Concurrency", c.Concurrency}, {"MaxResponseBody", c.MaxResponseBody}, {"ErrorBody", c.ErrorBody}, {"BreakerFailures", c.BreakerFailures}} {
		if n.v < 0 {
			return idemq.NewConfigError(component, n.name, "%d is negative", n.v)
		}
	}
	if c.ErrorBody > c.MaxResponseBody {
		return idemq.NewConfigError(component, "ErrorBody", "%d exceeds MaxResponseBody %d", c.ErrorBody, c.MaxResponseBody)
	}
	for _, p := range c.AllowedNetworks {
		if !p.IsValid() {
			return idemq.NewConfigError(component, "AllowedNetworks", "holds an invalid prefix")
		}
	}
	return nil
}

// Sink delivers the webhook rows of an outbox (destination
// "webhook/<endpoint id>", written by [endpoints.Publisher.PublishTx]) as Standard
// Webhooks POSTs. Route [endpoints.DestinationPrefix] to it on the relay's Router.
//
// Each endpoint is isolated: its own concurrency bound, rate limit,
// breaker and failure clock, and a slow endpoint holds up a batch at most
// for its Timeout, after which its breaker holds its rows out of later
// batches. It is safe for concurrent use.
type Sink struct {
	reg    *endpoints.Registry
	cfg    Config
	client *http.Client
	log    *slog.Logger

	mu         sync.Mutex
	endpoints  map[string]*endpointState
	unreadable bool // the last read of the registry failed
}

// NewSink validates cfg and returns a Sink delivering to the endpoints of
// reg.
func NewSink(reg *endpoints.Registry, cfg Config) (*Sink, error) {
	if reg == nil {
		return nil, idemq.NewConfigError("webhook.Sink", "reg", "is nil")
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Sink{
		reg:       reg,
		cfg:       cfg,
		client:    newClient(cfg.AllowedNetworks),
		log:       cfg.Logger.With("component", "idemq.webhook"),
		endpoints: map[string]*endpointState{},
	}, nil
}

// ErrHeld is wrapped by the error of a row the Sink held back without
// attempting it (disabled endpoint, open breaker, rate limit). It matches
// relay.ErrSkipped, and the error carries an idemq.RetryAfter hint: the
// relay puts the row back for that long without counting an attempt. Its
// text is the row's recorded reason, so it says why the row waits (the
// endpoint) and never ErrSkipped's "an earlier message of its key failed".
var ErrHeld error = heldError{}

// heldError is [ErrHeld]'s type: it matches relay.ErrSkipped without
// carrying its text.
type heldError struct{}

func (heldError) Error() string { return "webhook: held, not attempted" }

// Is makes a held row relay.ErrSkipped to the relay.
func (heldError) Is(target error) bool { return target == relay.ErrSkipped }

// hold returns the error that holds a row back for d.
func hold(d time.Duration, format string, args ...any) error {
	return idemq.RetryAfter(fmt.Errorf("%w: "+format, append([]any{ErrHeld}, args...)...), max(d, time.Millisecond))
}

// Publish implements relay.Sink. Rows of one key are delivered one after
// the other, in order; once one fails the rest of its key is skipped.
// Different keys and endpoints are delivered concurrently.
func (s *Sink) Publish(ctx context.Context, _ relay.BatchID, batch []relay.Message) error {
	states, loadErr := s.states(ctx, batch)
	failures := relay.NewFailures(batch)
	var mu sync.Mutex // guards failures
	chains := map[string][]int{}
	var order []string
	for i, m := range batch {
		chain := m.Key
		if chain == "" {
			chain = "\x00" + strconv.Itoa(i) // unkeyed: a chain of its own
		}
		if _, ok := chains[chain]; !ok {
			order = append(order, chain)
		}
		chains[chain] = append(chains[chain], i)
	}
	var wg sync.WaitGroup
	for _, chain := range order {
		wg.Go(func() {
			for _, i := range chains[chain] {
				mu.Lock()
				skip := failures.Skip(i)
				mu.Unlock()
				if skip {
					continue
				}
				m := batch[i]
				id, ok := strings.CutPrefix(m.Destination, endpoints.DestinationPrefix)
				var err error
				switch st := states[id]; {
				case !ok:
					err = idemq.Permanent(fmt.Errorf("webhook: destination %q does not start with %q", m.Destination, endpoints.DestinationPrefix))
				case st == nil && loadErr != nil:
					err = hold(time.Second, "reading endpoint %s: %v", id, loadErr)
				case st == nil:
					err = idemq.Permanent(fmt.Errorf("webhook: %w: %s", endpoints.ErrEndpointNotFound, id))
				default:
					err = s.deliver(ctx, st, m)
				}
				mu.Lock()
				failures.Fail(i, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return failures.Err(ctx)
}

// states returns the endpoints of batch, reading those not read within
// RefreshInterval. On a read error the stale copies are kept.
func (s *Sink) states(ctx context.Context, batch []relay.Message) (map[string]*endpointState, error) {
	now := time.Now()
	out := map[string]*endpointState{}
	var stale []string
	s.mu.Lock()
	for _, m := range batch {
		id, ok := strings.CutPrefix(m.Destination, endpoints.DestinationPrefix)
		if _, seen := out[id]; !ok || seen {
			continue
		}
		st := s.endpoints[id]
		out[id] = st
		// A disabled endpoint is read every time its rows come back (once
		// per HoldInterval, or when Outbox.RetryNow sends them early), so
		// that rows sent after Enable are not held once more.
		if st == nil || st.disabled() || now.Sub(st.loadedAt()) >= s.cfg.RefreshInterval {
			stale = append(stale, id)
		}
	}
	s.mu.Unlock()
	if len(stale) == 0 {
		return out, nil
	}
	eps, err := s.reg.List(ctx, stale...)
	s.readDone(ctx, err)
	if err != nil {
		return out, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	found := map[string]bool{}
	for _, ep := range eps {
		st := s.endpoints[ep.ID]
		if st == nil {
			st = &endpointState{}
		}
		st.refresh(ep, s.cfg, now)
		s.endpoints[ep.ID] = st
		out[ep.ID] = st
		found[ep.ID] = true
	}
	for _, id := range stale {
		if !found[id] { // removed from the registry
			out[id] = nil
			delete(s.endpoints, id)
		}
	}
	return out, nil
}

// readDone logs, once per change, that reading the registry fails (its
// tables missing, the database away) and that it works again: the rows it
// holds meanwhile say why in their errors, but the relay logs a Sink's
// holds at debug level only. A read cut short by ctx is neither.
func (s *Sink) readDone(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return
	}
	s.mu.Lock()
	was := s.unreadable
	s.unreadable = err != nil
	s.mu.Unlock()
	switch {
	case err != nil && !was:
		s.log.Warn("webhook: reading the endpoints failed; their rows are held without an attempt until it works", "err", err)
	case err == nil && was:
		s.log.Info("webhook: reading the endpoints works again")
	}
}

// maxRateWait is the longest a delivery waits for its endpoint's rate
// limit inside a batch; a longer wait holds the row instead, so a slow
// rate never holds the batch's other endpoints.
const maxRateWait = 50 * time.Millisecond

func (s *Sink) deliver(ctx context.Context, st *endpointState, m relay.Message) error {
	// Take a slot first and judge the endpoint after: a delivery that
	// waited for a slot sees the breaker its predecessors opened.
	sem := st.slots()
	select {
	case sem <- struct{}{}:
		defer func() { <-sem }()
	case <-ctx.Done():
		return ctx.Err()
	}
	ep, keys, err := s.admit(st, time.Now())
	if err != nil {
		return err
	}
	r := st.limiter.Reserve()
	if d := r.Delay(); d > maxRateWait {
		r.Cancel()
		s.settle(ctx, st, outcomeHeld, nil)
		return hold(d, "endpoint %s: rate limit %v/s", ep.ID, ep.RateLimit)
	} else if d > 0 {
		if err := lifecycle.Sleep(ctx, d); err != nil {
			s.settle(ctx, st, outcomeHeld, nil)
			return err
		}
	}
	start := time.Now()
	status, err := s.post(ctx, ep, keys, m)
	took := time.Since(start)
	out := classify(status, err)
	if ctx.Err() != nil && status == 0 {
		// The relay gave up on the batch (shutdown): not the endpoint's
		// fault and not an attempt.
		s.settle(ctx, st, outcomeHeld, nil)
		return ctx.Err()
	}
	s.settle(ctx, st, out, err)
	if out == outcomeDelivered {
		if h := s.cfg.Hooks.OnDelivered; h != nil {
			h(DeliveredEvent{Endpoint: ep.ID, Message: m, Status: status, Took: took})
		}
		return nil
	}
	if h := s.cfg.Hooks.OnFailed; h != nil {
		h(FailedEvent{Endpoint: ep.ID, Message: m, Err: err, Took: took})
	}
	switch out {
	case outcomeGone:
		return hold(s.cfg.HoldInterval, "endpoint %s disabled: %v", ep.ID, err)
	case outcomePermanent:
		return idemq.Permanent(err)
	}
	return err
}
