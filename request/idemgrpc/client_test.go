package idemgrpc

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"github.com/idemq/idemq"
	"github.com/idemq/idemq/request/idemgrpc/internal/testpb"
	grpcgo "google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// fastRetry retries at once, so the tests spend no time sleeping.
var fastRetry = idemq.Retry{BaseDelay: time.Microsecond, MaxDelay: time.Microsecond}

// flaky returns a Ledger whose Charge records each call and fails the
// first failures of them with UNAVAILABLE.
func flaky(seen *attempts, failures int) *ledger {
	return &ledger{charge: func(ctx context.Context, req *testpb.ChargeRequest) (*testpb.ChargeResponse, error) {
		if seen.record(ctx) <= failures {
			return nil, status.Error(codes.Unavailable, "try again")
		}
		return &testpb.ChargeResponse{ChargeId: "ch-1", Amount: req.Amount}, nil
	}}
}

func clientInterceptor(tb testing.TB, cfg ClientConfig) grpcgo.UnaryClientInterceptor {
	tb.Helper()
	ic, err := UnaryClientInterceptor(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return ic
}

// oneKey fails unless every value is the same UUIDv7.
func oneKey(tb testing.TB, keys []string) {
	tb.Helper()
	id, err := uuid.Parse(keys[0])
	if err != nil || id.Version() != 7 {
		tb.Fatalf("key %q is not a UUIDv7 (%v)", keys[0], err)
	}
	if slices.Compact(slices.Clone(keys))[0] != keys[0] || len(slices.Compact(slices.Clone(keys))) != 1 {
		tb.Fatalf("attempts carried different keys: %q", keys)
	}
}

func TestClientRetriesKeepTheKey(t *testing.T) {
	var seen attempts
	addr := serve(t, flaky(&seen, 2))
	var retried []RetryEvent
	onRetry := func(ev RetryEvent) { retried = append(retried, ev) } // the call's goroutine
	c := dial(t, addr, grpcgo.WithUnaryInterceptor(clientInterceptor(t, ClientConfig{Retry: fastRetry, Hooks: ClientHooks{OnRetry: onRetry}})))

	resp, err := c.Charge(t.Context(), &testpb.ChargeRequest{Account: "a", Amount: 5})
	if err != nil || resp.ChargeId != "ch-1" {
		t.Fatalf("Charge = %v, %v", resp, err)
	}
	if seen.count() != 3 {
		t.Fatalf("server saw %d attempts, want 3", seen.count())
	}
	keys := seen.values(MetadataKey)
	oneKey(t, keys)
	if len(retried) != 2 || retried[0].Attempt != 1 || retried[1].Attempt != 2 || retried[1].Key != keys[0] ||
		retried[0].Method != testpb.Ledger_Charge_FullMethodName || status.Code(retried[0].Err) != codes.Unavailable {
		t.Fatalf("OnRetry events %+v", retried)
	}
}

// grpc-go's retryPolicy replays the call below the interceptors, so every
// attempt carries the key the interceptor added once.
func TestClientKeyKeptByGRPCRetryPolicy(t *testing.T) {
	var seen attempts
	addr := serve(t, flaky(&seen, 2))
	const serviceConfig = `{"methodConfig": [{
		"name": [{"service": "idemq.grpctest.v1.Ledger"}],
		"retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.001s", "maxBackoff": "0.001s",
			"backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE"]}}]}`
	c := dial(t, addr,
		grpcgo.WithDefaultServiceConfig(serviceConfig),
		grpcgo.WithUnaryInterceptor(clientInterceptor(t, ClientConfig{Retry: idemq.Retry{MaxAttempts: 1}})))

	if _, err := c.Charge(t.Context(), &testpb.ChargeRequest{Account: "a", Amount: 5}); err != nil {
		t.Fatal(err)
	}
	if got := seen.values("grpc-previous-rpc-attempts"); !slices.Equal(got, []string{"", "1", "2"}) {
		t.Fatalf("grpc-previous-rpc-attempts = %q: grpc-go did not retry", got)
	}
	oneKey(t, seen.values(MetadataKey))
}

// go-grpc-middleware's retry runs the rest of the chain once per attempt:
// the key interceptor must come before it.
func TestClientKeyOutsideMiddlewareRetry(t *testing.T) {
	mwRetry := retry.UnaryClientInterceptor(retry.WithMax(3), retry.WithCodes(codes.Unavailable),
		retry.WithBackoff(retry.BackoffLinear(time.Millisecond)))
	keys := clientInterceptor(t, ClientConfig{Retry: idemq.Retry{MaxAttempts: 1}})

	t.Run("keys before retry: one key", func(t *testing.T) {
		var seen attempts
		c := dial(t, serve(t, flaky(&seen, 2)), grpcgo.WithChainUnaryInterceptor(keys, mwRetry))
		if _, err := c.Charge(t.Context(), &testpb.ChargeRequest{Amount: 1}); err != nil {
			t.Fatal(err)
		}
		if got := seen.values(retry.AttemptMetadataKey); !slices.Equal(got, []string{"", "1", "2"}) {
			t.Fatalf("%s = %q: the middleware did not retry", retry.AttemptMetadataKey, got)
		}
		oneKey(t, seen.values(MetadataKey))
	})
	t.Run("keys after retry: a key per attempt", func(t *testing.T) {
		var seen attempts
		c := dial(t, serve(t, flaky(&seen, 2)), grpcgo.WithChainUnaryInterceptor(mwRetry, keys))
		if _, err := c.Charge(t.Context(), &testpb.ChargeRequest{Amount: 1}); err != nil {
			t.Fatal(err)
		}
		if got := slices.Compact(seen.values(MetadataKey)); len(got) != 3 {
			t.Fatalf("keys = %q, want three different ones: the misplacement this test documents is gone", got)
		}
	})
}

func TestClientKeepsCallerKey(t *testing.T) {
	var seen attempts
	addr := serve(t, flaky(&seen, 0))
	c := dial(t, addr, grpcgo.WithUnaryInterceptor(clientInterceptor(t, ClientConfig{})))
	ctx := metadata.AppendToOutgoingContext(t.Context(), MetadataKey, "order-42")
	if _, err := c.Charge(ctx, &testpb.ChargeRequest{Amount: 1}); err != nil {
		t.Fatal(err)
	}
	if got := seen.values(MetadataKey); !slices.Equal(got, []string{"order-42"}) {
		t.Fatalf("keys = %q, want the caller's", got)
	}
}

func TestClientOnlyListedMethods(t *testing.T) {
	var seen attempts
	addr := serve(t, flaky(&seen, 0))
	ic := clientInterceptor(t, ClientConfig{Methods: []string{testpb.Ledger_Transfer_FullMethodName}})
	c := dial(t, addr, grpcgo.WithUnaryInterceptor(ic))
	if _, err := c.Charge(t.Context(), &testpb.ChargeRequest{Amount: 1}); err != nil {
		t.Fatal(err)
	}
	if got := seen.values(MetadataKey); !slices.Equal(got, []string{""}) {
		t.Fatalf("keys = %q on an unlisted method", got)
	}
}

// A negative pushback is the server's order not to retry (gRFC A6).
func TestClientHonoursPushback(t *testing.T) {
	for _, tc := range []struct {
		pushback string
		want     int
	}{{"-1", 1}, {"1", 2}} {
		t.Run(tc.pushback, func(t *testing.T) {
			var seen attempts
			addr := serve(t, &ledger{charge: func(ctx context.Context, req *testpb.ChargeRequest) (*testpb.ChargeResponse, error) {
				if seen.record(ctx) == 1 {
					_ = grpcgo.SetTrailer(ctx, metadata.Pairs(PushbackTrailer, tc.pushback))
					return nil, status.Error(codes.Aborted, "in flight")
				}
				return &testpb.ChargeResponse{}, nil
			}})
			c := dial(t, addr, grpcgo.WithUnaryInterceptor(clientInterceptor(t, ClientConfig{Retry: fastRetry})))
			_, _ = c.Charge(t.Context(), &testpb.ChargeRequest{})
			if seen.count() != tc.want {
				t.Fatalf("attempts = %d, want %d", seen.count(), tc.want)
			}
		})
	}
}

// A dependency that fails every call sees at most RetryRatio·calls + the
// floor in retries, whether the interceptor retries or go-grpc-middleware
// does with the budget's predicate.
func TestRetryBudgetBoundsRetriesOnAFailingDependency(t *testing.T) {
	const calls, maxAttempts = 100, 4
	const ratio, minPerSecond, window = 0.2, 0.01, 1000 * time.Second // floor: 10 retries
	const bound = ratio*calls + minPerSecond*1000

	setups := map[string]func(*RetryBudget, *atomic.Int64) []grpcgo.DialOption{
		"interceptor retries": func(b *RetryBudget, exhausted *atomic.Int64) []grpcgo.DialOption {
			ic := clientInterceptor(t, ClientConfig{
				Retry:  idemq.Retry{MaxAttempts: maxAttempts, BaseDelay: time.Microsecond, MaxDelay: time.Microsecond},
				Budget: b,
				Hooks:  ClientHooks{OnBudgetExhausted: func(RetryEvent) { exhausted.Add(1) }},
			})
			return []grpcgo.DialOption{grpcgo.WithUnaryInterceptor(ic)}
		},
		"go-grpc-middleware retries": func(b *RetryBudget, exhausted *atomic.Int64) []grpcgo.DialOption {
			keys := clientInterceptor(t, ClientConfig{Retry: idemq.Retry{MaxAttempts: 1}, Budget: b})
			allowed := b.Retriable(codes.Unavailable)
			mwRetry := retry.UnaryClientInterceptor(retry.WithMax(maxAttempts),
				retry.WithBackoff(retry.BackoffLinear(time.Microsecond)),
				retry.WithRetriable(func(err error) bool {
					ok := allowed(err)
					if !ok {
						exhausted.Add(1)
					}
					return ok
				}))
			return []grpcgo.DialOption{grpcgo.WithChainUnaryInterceptor(keys, mwRetry)}
		},
	}
	for name, setup := range setups {
		t.Run(name, func(t *testing.T) {
			budget, err := NewRetryBudget(BudgetConfig{RetryRatio: ratio, MinRetriesPerSecond: minPerSecond, Window: window})
			if err != nil {
				t.Fatal(err)
			}
			frozen := time.Now()
			budget.now = func() time.Time { return frozen } // the whole test within one window

			var seen attempts
			var exhausted atomic.Int64
			c := dial(t, serve(t, flaky(&seen, calls*maxAttempts)), setup(budget, &exhausted)...)
			for range calls {
				if _, err := c.Charge(t.Context(), &testpb.ChargeRequest{Amount: 1}); status.Code(err) != codes.Unavailable {
					t.Fatalf("Charge: %v, want UNAVAILABLE", err)
				}
			}
			retries := seen.count() - calls
			t.Logf("%d calls, %d retries (bound %.0f, %d without a budget), %d refused", calls, retries, bound, calls*(maxAttempts-1), exhausted.Load())
			if retries > bound || retries == 0 {
				t.Fatalf("retries = %d, want between 1 and %.0f", retries, bound)
			}
			if exhausted.Load() == 0 {
				t.Fatal("the budget never refused a retry")
			}
		})
	}
}

func TestRetryBudgetSlides(t *testing.T) {
	b, err := NewRetryBudget(BudgetConfig{RetryRatio: 0.5, MinRetriesPerSecond: 0.1, Window: 10 * time.Second}) // floor: 1
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1e9, 0)
	b.now = func() time.Time { return now }
	withdrawals := func() (n int) {
		for b.Withdraw() {
			n++
		}
		return n
	}
	for range 10 {
		b.Deposit()
	}
	if n := withdrawals(); n != 6 {
		t.Fatalf("withdrew %d, want 0.5·10 + 1", n)
	}
	now = now.Add(5 * time.Second)
	for range 4 {
		b.Deposit()
	}
	if n := withdrawals(); n != 2 {
		t.Fatalf("withdrew %d, want 0.5·14 + 1 - 6", n)
	}
	now = now.Add(6 * time.Second) // the first ten requests and six retries have left the window
	if n := withdrawals(); n != 1 {
		t.Fatalf("withdrew %d, want 0.5·4 + 1 - 2", n)
	}
	now = now.Add(time.Hour)
	if n := withdrawals(); n != 1 {
		t.Fatalf("withdrew %d after an idle hour, want the floor", n)
	}
}

func TestClientConfigErrors(t *testing.T) {
	for name, cfg := range map[string]ClientConfig{
		"Retry.MaxAttempts": {Retry: idemq.Retry{MaxAttempts: -1}},
		"Methods":           {Methods: []string{"Charge"}},
		"RetryCodes":        {RetryCodes: []codes.Code{codes.OK}},
	} {
		_, err := UnaryClientInterceptor(cfg)
		var ce *idemq.ConfigError
		if !errors.Is(err, idemq.ErrConfig) || !errors.As(err, &ce) || ce.Field != name {
			t.Errorf("%s: err = %v", name, err)
		}
	}
	for name, cfg := range map[string]BudgetConfig{
		"RetryRatio":          {RetryRatio: -0.1},
		"MinRetriesPerSecond": {MinRetriesPerSecond: -1},
		"Window":              {Window: time.Millisecond},
	} {
		_, err := NewRetryBudget(cfg)
		var ce *idemq.ConfigError
		if !errors.Is(err, idemq.ErrConfig) || !errors.As(err, &ce) || ce.Field != name {
			t.Errorf("%s: err = %v", name, err)
		}
	}
}
