package idemq

import (
	"context"
	"errors"
)

// ErrRunning is returned by Run of a component that is already running.
var ErrRunning = errors.New("idemq: already running")

// Service is the lifecycle every long-running idemq component shares (the
// relay, the Kafka and NATS subscribers, ...).
//
// Run blocks until ctx is done or the component fails; once ctx is done the
// component stops taking work and gives what is in flight its ShutdownGrace
// to finish. Run returns nil after a clean stop, [ErrRunning] while another
// Run of the same value is active, and otherwise the error that ended it. A
// component may be run again after Run returned.
//
// Ready is closed once the current (or next) Run is ready for work: it has
// subscribed, joined its group or is listening. It stays open if Run fails
// first.
type Service interface {
	Run(ctx context.Context) error
	Ready() <-chan struct{}
}

// Running is a [Service] started by [Start].
type Running struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// Start runs s in a goroutine and returns once it is ready. If Run returns
// first, or ctx is done first, Start stops s and returns the error.
func Start(ctx context.Context, s Service) (*Running, error) {
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r := &Running{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.err = s.Run(runCtx)
	}()
	select {
	case <-s.Ready():
		return r, nil
	case <-r.done:
		cancel()
		if r.err == nil {
			r.err = errors.New("idemq: service stopped before it was ready")
		}
		return nil, r.err
	case <-ctx.Done():
		return nil, errors.Join(ctx.Err(), r.Stop())
	}
}

// Stop cancels the service's context, waits for Run to return and returns
// its error.
func (r *Running) Stop() error {
	r.cancel()
	<-r.done
	return r.err
}

// Done is closed when Run has returned, on its own or after Stop.
func (r *Running) Done() <-chan struct{} { return r.done }

// Err returns Run's error once Done is closed, nil before.
func (r *Running) Err() error {
	select {
	case <-r.done:
		return r.err
	default:
		return nil
	}
}
