package idemgrpc

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/idemq/idemq"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// BudgetConfig sizes a [RetryBudget]. The defaults are Linkerd's
// ServiceProfile defaults, so a client and the mesh in front of it can be
// given the same numbers.
type BudgetConfig struct {
	// RetryRatio is the number of retries allowed per request over the
	// window: 0.2 lets retries add at most 20 % to the load on a failing
	// dependency. Defaults to 0.2.
	RetryRatio float64
	// MinRetriesPerSecond is the floor of retries allowed whatever the
	// traffic, so that a client sending few requests can still retry.
	// Defaults to 10.
	MinRetriesPerSecond float64
	// Window is how long a request or a retry counts against the budget.
	// Defaults to 10 seconds.
	Window time.Duration
}

// Budget defaults, as in Linkerd's ServiceProfile retryBudget.
const (
	RetryRatioDefault          = 0.2
	MinRetriesPerSecondDefault = 10
	WindowDefault              = 10 * time.Second
)

func (c BudgetConfig) withDefaults() BudgetConfig {
	c.RetryRatio = cmp.Or(c.RetryRatio, RetryRatioDefault)
	c.MinRetriesPerSecond = cmp.Or(c.MinRetriesPerSecond, MinRetriesPerSecondDefault)
	c.Window = cmp.Or(c.Window, WindowDefault)
	return c
}

func (c BudgetConfig) validate() error {
	const component = "grpc.RetryBudget"
	switch {
	case c.RetryRatio < 0:
		return idemq.NewConfigError(component, "RetryRatio", "%v is negative", c.RetryRatio)
	case c.MinRetriesPerSecond < 0:
		return idemq.NewConfigError(component, "MinRetriesPerSecond", "%v is negative", c.MinRetriesPerSecond)
	case c.Window < 0:
		return idemq.NewConfigError(component, "Window", "%v is negative", c.Window)
	case c.Window > 0 && c.Window < budgetSlots*time.Millisecond:
		return idemq.NewConfigError(component, "Window", "%v is shorter than %v", c.Window, budgetSlots*time.Millisecond)
	}
	return nil
}

// budgetSlots is how finely the window slides: a request leaves the budget
// between Window and Window·(1+1/budgetSlots) after it was counted.
const budgetSlots = 10

// RetryBudget bounds retries to a share of recent requests, so that a
// dependency failing every call sees at most (1+RetryRatio) times its normal
// load plus a small floor, instead of MaxAttempts times. Requests and retries
// are counted over a sliding window: a retry is allowed while
//
//	retries < RetryRatio·requests + MinRetriesPerSecond·Window
//
// One budget is meant to be shared by every client of one dependency; it is
// safe for concurrent use.
type RetryBudget struct {
	cfg   BudgetConfig
	slot  time.Duration
	floor float64

	mu       sync.Mutex
	now      func() time.Time
	head     int       // index of the current slot
	headEnds time.Time // end of the current slot
	requests [budgetSlots]int64
	retries  [budgetSlots]int64
}

// NewRetryBudget returns a budget with cfg's limits, or an error matching
// idemq.ErrConfig.
func NewRetryBudget(cfg BudgetConfig) (*RetryBudget, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &RetryBudget{
		cfg:   cfg,
		slot:  cfg.Window / budgetSlots,
		floor: cfg.MinRetriesPerSecond * cfg.Window.Seconds(),
		now:   time.Now,
	}, nil
}

// Deposit counts one request (a first attempt) into the budget.
func (b *RetryBudget) Deposit() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance()
	b.requests[b.head]++
}

// Withdraw reports whether one more retry fits the budget and, if so,
// counts it.
func (b *RetryBudget) Withdraw() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance()
	var requests, retries int64
	for i := range budgetSlots {
		requests += b.requests[i]
		retries += b.retries[i]
	}
	if float64(retries) >= b.cfg.RetryRatio*float64(requests)+b.floor {
		return false
	}
	b.retries[b.head]++
	return true
}

// Retriable returns a predicate that allows a retry of an error with one
// of codes while the budget lasts, for go-grpc-middleware's
// retry.WithRetriable. The calls must be counted with [RetryBudget.Deposit]:
// give the same budget to [UnaryClientInterceptor], placed before the retry
// interceptor. That middleware also asks after its last attempt, which
// spends a retry it does not make: the budget then errs towards fewer
// retries.
func (b *RetryBudget) Retriable(codes ...codes.Code) func(error) bool {
	return func(err error) bool {
		return slices.Contains(codes, status.Code(err)) && b.Withdraw()
	}
}

// advance moves the head to the slot of now, clearing the slots it passes.
func (b *RetryBudget) advance() {
	now := b.now()
	if b.headEnds.IsZero() {
		b.headEnds = now.Add(b.slot)
		return
	}
	for n := 0; !now.Before(b.headEnds); n++ {
		if n == budgetSlots { // idle for a whole window: start afresh
			b.headEnds = now.Add(b.slot)
			return
		}
		b.head = (b.head + 1) % budgetSlots
		b.requests[b.head], b.retries[b.head] = 0, 0
		b.headEnds = b.headEnds.Add(b.slot)
	}
}
