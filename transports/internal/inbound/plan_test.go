package inbound

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
)

var (
	applied   = consumer.Result{Outcome: consumer.Applied}
	duplicate = consumer.Result{Outcome: consumer.Duplicate}
	dead      = consumer.Result{Outcome: consumer.DeadLettered, Err: errors.New("poison")}
	conflict  = consumer.Result{Outcome: consumer.Conflict, Err: errors.New("other payload")}
	down      = consumer.Result{Outcome: consumer.Retry, Err: errors.New("connection refused"), Unavailable: true}
	// failed is a handler failure handed back in the consumer's Redeliver
	// mode; leased a key another worker holds; stopped a shutdown.
	failed    = consumer.Result{Outcome: consumer.Retry, Err: errors.New("handler"), RetryAfter: 3 * time.Second, Attempts: 1}
	leased    = consumer.Result{Outcome: consumer.Retry, Err: consumer.ErrInProgress, RetryAfter: 20 * time.Second}
	stopped   = consumer.Result{Outcome: consumer.Retry, Err: errors.New("context canceled")}
	untouched = consumer.Result{Outcome: consumer.Retry, Err: errNotAttempted}
)

func TestDecide(t *testing.T) {
	t.Parallel()
	const (
		A, D, R, H = Ack, DeadLetter, Redeliver, Hold
	)
	for _, c := range []struct {
		name      string
		results   []consumer.Result
		redeliver bool
		want      []Action
		held      int
		delay     time.Duration
		outage    bool
		dead      []int
	}{
		{name: "nothing", results: nil, want: []Action{}},
		{name: "applied and duplicates are acknowledged", results: []consumer.Result{applied, duplicate, applied}, want: []Action{A, A, A}, held: 3},
		{name: "dead letters and conflicts are copied, then acknowledged", results: []consumer.Result{applied, dead, duplicate, conflict},
			want: []Action{A, D, A, D}, held: 4, dead: []int{1, 3}},
		{name: "an outage holds the message and all behind it", results: []consumer.Result{applied, dead, down, applied, dead},
			want: []Action{A, D, H, H, H}, held: 2, outage: true, dead: []int{1}},
		{name: "an outage holds even where the client could hand one message back", results: []consumer.Result{applied, down, applied}, redeliver: true,
			want: []Action{A, H, H}, held: 1, outage: true},
		{name: "an outage at the first message holds the group", results: []consumer.Result{down, down}, want: []Action{H, H}, held: 0, outage: true},
		{name: "a handler failure is handed back on its own where the client can", results: []consumer.Result{failed, applied}, redeliver: true,
			want: []Action{R, A}, held: 2},
		{name: "a handler failure holds where the client cannot hand one back", results: []consumer.Result{applied, failed, applied},
			want: []Action{A, H, H}, held: 1, delay: 3 * time.Second},
		{name: "a key leased elsewhere holds until the lease ends, even where the client could hand it back", results: []consumer.Result{applied, leased, applied}, redeliver: true,
			want: []Action{A, H, H}, held: 1, delay: 20 * time.Second},
		{name: "a shutdown holds where the client could hand it back", results: []consumer.Result{stopped, applied}, redeliver: true,
			want: []Action{H, H}, held: 0},
		{name: "a key leased elsewhere holds until the lease ends", results: []consumer.Result{leased, applied},
			want: []Action{H, H}, held: 0, delay: 20 * time.Second},
		{name: "a shutdown holds, for the backoff", results: []consumer.Result{applied, stopped}, want: []Action{A, H}, held: 1},
		{name: "messages left alone stay behind the held one", results: []consumer.Result{applied, down, untouched, untouched}, redeliver: true,
			want: []Action{A, H, H, H}, held: 1, outage: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := Decide(c.results, c.redeliver)
			actions := make([]Action, len(p.Steps))
			for i, s := range p.Steps {
				actions[i] = s.Action
			}
			if !slices.Equal(actions, c.want) || p.Held != c.held || p.Delay != c.delay || p.Outage != c.outage {
				t.Fatalf("plan %v held %d delay %v outage %v; want %v held %d delay %v outage %v",
					actions, p.Held, p.Delay, p.Outage, c.want, c.held, c.delay, c.outage)
			}
			if got := p.DeadLetters(); !slices.Equal(got, c.dead) {
				t.Fatalf("dead letters %v, want %v", got, c.dead)
			}
			for i, s := range p.Steps {
				if s.Action == Redeliver && s.Delay != c.results[i].RetryAfter {
					t.Fatalf("message %d handed back after %v, want its RetryAfter %v", i, s.Delay, c.results[i].RetryAfter)
				}
			}
		})
	}
}
