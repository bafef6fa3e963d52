package lifecycle

import (
	"context"
	"errors"
	"time"

	"github.com/idemq/idemq"
)

// KeepAlive renews a lease in the background: it calls renew every
// interval until stop is called, ctx is done or a renewal reports the
// lease lost. It is the one renewal loop of idemq: the consumer's leased
// mode, the request Guard's attempts, the relay's heartbeat and the NATS
// subscriber's in-progress acks run on it, each with its own renew.
//
// Each renewal gets a context that ends after interval, so one that hangs
// cannot eat the lease it renews: the next tick tries again. Renewals run
// on a goroutine of their own and never wait for the work they protect;
// a renew that needs a connection should not take it from a pool the work
// can exhaust.
//
// An error matching [idemq.ErrLeaseLost] ends the renewals: renew does
// what the loss means for the work (cancel it, say) before returning it.
// Any other error is renew's to report; the next tick tries again.
//
// stop ends the renewals, waits for the one in flight and returns the
// error that reported the loss, nil if none. It may be called more than
// once.
func KeepAlive(ctx context.Context, interval time.Duration, renew func(context.Context) error) (stop func() error) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	var lost error
	go func() {
		defer close(done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			rctx, rcancel := context.WithTimeout(ctx, interval)
			err := renew(rctx)
			rcancel()
			if errors.Is(err, idemq.ErrLeaseLost) {
				lost = err
				return
			}
		}
	}()
	return func() error {
		cancel()
		<-done
		return lost
	}
}
