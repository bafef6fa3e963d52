package idemgrpc

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/google/uuid"
	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/lifecycle"
	grpcgo "google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// ClientConfig configures [UnaryClientInterceptor].
type ClientConfig struct {
	// Methods lists the full method names ("/orders.v1.Orders/CreateOrder")
	// whose calls get a key. Defaults to every unary method.
	Methods []string
	// Retry is the interceptor's own retry policy; every attempt of a call
	// carries the call's one key. MaxAttempts counts the first attempt, so
	// 1 turns retrying off (leave it to grpc-go's retryPolicy, to
	// go-grpc-middleware's retry placed after this interceptor, or to a
	// mesh). Defaults to [RetryDefault].
	Retry idemq.Retry
	// RetryCodes are the status codes worth another attempt with the same
	// key. Defaults to [RetryCodesDefault].
	RetryCodes []codes.Code
	// Budget caps retries to a share of recent calls. Share one budget
	// between the clients of one dependency. Defaults to a budget of this
	// interceptor alone with [BudgetConfig]'s defaults.
	Budget *RetryBudget
	// Hooks observe retries.
	Hooks ClientHooks
}

// RetryDefault is the client's retry policy: three attempts in all, the
// retries within a second, never longer than ten seconds for one call.
var RetryDefault = idemq.Retry{
	MaxAttempts: 3,
	BaseDelay:   50 * time.Millisecond,
	MaxDelay:    time.Second,
	MaxElapsed:  10 * time.Second,
}

// RetryCodesDefault are retried by default: the server did not run the call
// or released its key (UNAVAILABLE, RESOURCE_EXHAUSTED), or another attempt
// with the key is still running and a retry will get its response
// (ABORTED).
var RetryCodesDefault = []codes.Code{codes.Unavailable, codes.ResourceExhausted, codes.Aborted}

// ClientHooks observe the client interceptor. Nil fields are skipped.
type ClientHooks struct {
	// OnRetry is called before each retry, after its delay was chosen.
	OnRetry func(RetryEvent)
	// OnBudgetExhausted is called when a call that could have been retried
	// was not, because the budget was spent.
	OnBudgetExhausted func(RetryEvent)
}

// RetryEvent describes one retry decision.
type RetryEvent struct {
	Method string
	Key    string
	// Attempt is the number of the attempt that just failed (1-based).
	Attempt int
	// Err is that attempt's error.
	Err error
	// Delay is the wait before the retry (zero when it was refused).
	Delay time.Duration
}

const clientComponent = "grpc.UnaryClientInterceptor"

func (c ClientConfig) withDefaults() (ClientConfig, error) {
	c.Retry = c.Retry.WithDefaults(RetryDefault)
	if c.RetryCodes == nil {
		c.RetryCodes = RetryCodesDefault
	}
	if c.Budget == nil {
		b, err := NewRetryBudget(BudgetConfig{})
		if err != nil {
			return c, err
		}
		c.Budget = b
	}
	return c, nil
}

func (c ClientConfig) validate() error {
	if err := c.Retry.Validate(clientComponent); err != nil {
		return err
	}
	for _, m := range c.Methods {
		if !validFullMethod(m) {
			return idemq.NewConfigError(clientComponent, "Methods", "%q is not a full method name like /package.Service/Method", m)
		}
	}
	for _, code := range c.RetryCodes {
		if code == codes.OK || code > codes.Unauthenticated {
			return idemq.NewConfigError(clientComponent, "RetryCodes", "%v is not an error code", code)
		}
	}
	return nil
}

// UnaryClientInterceptor gives every call one idempotency key, kept by all
// of its attempts, and retries it within a budget (see the package
// documentation). The key is the one already on the outgoing metadata
// ([MetadataKey]), else one derived from the call being served when ctx
// comes from a handler behind [UnaryServerInterceptor], else a fresh
// UUIDv7.
//
// Placement: before go-grpc-middleware's retry interceptor
// (grpc.WithChainUnaryInterceptor(keys, retry.UnaryClientInterceptor(...))),
// which calls the rest of the chain once per attempt; placed after it,
// every attempt would get a new key and the server would run each one.
func UnaryClientInterceptor(cfg ClientConfig) (grpcgo.UnaryClientInterceptor, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	c := &client{cfg: cfg}
	return c.intercept, nil
}

type client struct{ cfg ClientConfig }

func (c *client) intercept(ctx context.Context, method string, req, reply any, cc *grpcgo.ClientConn, invoker grpcgo.UnaryInvoker, opts ...grpcgo.CallOption) error {
	if c.cfg.Methods != nil && !slices.Contains(c.cfg.Methods, method) {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	key, ok := outgoingKey(ctx)
	if !ok {
		if in, served := ctx.Value(inboundCtxKey{}).(*inbound); served {
			key = in.downstreamKey(method)
		} else {
			key = newKey()
		}
		ctx = metadata.AppendToOutgoingContext(ctx, MetadataKey, key)
	}
	c.cfg.Budget.Deposit()
	// The loop takes its delays from a BackOff rather than running under
	// backoff.RetryNotify: the retry budget is withdrawn between the
	// delay's decision and the wait, and an empty budget ends the loop.
	back := c.cfg.Retry.BackOff()
	var trailer metadata.MD
	opts = append(slices.Clip(opts), grpcgo.Trailer(&trailer))
	for attempt := 1; ; attempt++ {
		trailer = nil
		err := invoker(ctx, method, req, reply, cc, opts...)
		if err == nil || !slices.Contains(c.cfg.RetryCodes, status.Code(err)) || ctx.Err() != nil {
			return err
		}
		pushback, retry := pushbackOf(trailer)
		ev := RetryEvent{Method: method, Key: key, Attempt: attempt, Err: err}
		if !retry {
			return err
		}
		back.Hint(pushback)
		if ev.Delay = back.NextBackOff(); ev.Delay == backoff.Stop { // MaxAttempts or MaxElapsed
			return err
		}
		if !c.cfg.Budget.Withdraw() {
			if h := c.cfg.Hooks.OnBudgetExhausted; h != nil {
				ev.Delay = 0
				h(ev)
			}
			return err
		}
		if h := c.cfg.Hooks.OnRetry; h != nil {
			h(ev)
		}
		if lifecycle.Sleep(ctx, ev.Delay) != nil {
			return err
		}
	}
}

// newKey returns a UUIDv7: unique, and sortable by creation time in the
// server's records.
func newKey() string {
	if id, err := uuid.NewV7(); err == nil {
		return id.String()
	}
	return uuid.NewString() // v7 fails only when the random source does
}

// pushbackOf reads gRFC A6 server pushback: a delay to wait at least, or,
// when the value is negative or malformed, an order not to retry.
func pushbackOf(trailer metadata.MD) (time.Duration, bool) {
	v := trailer.Get(PushbackTrailer)
	if len(v) == 0 {
		return 0, true
	}
	ms, err := strconv.ParseInt(v[0], 10, 64)
	if err != nil || ms < 0 {
		return 0, false
	}
	return time.Duration(ms) * time.Millisecond, true
}

// validFullMethod reports whether m looks like "/package.Service/Method".
func validFullMethod(m string) bool {
	if len(m) < 4 || m[0] != '/' {
		return false
	}
	i := strings.LastIndexByte(m, '/')
	return i > 1 && i < len(m)-1
}
