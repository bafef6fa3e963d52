package relay

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/outbox"
)

func claimed(keysAttempts ...any) []row {
	var rows []row
	for i := 0; i < len(keysAttempts); i += 2 {
		rows = append(rows, row{seq: int64(len(rows) + 1), msg: Message{
			Message:  outbox.Message{Destination: "d", Key: keysAttempts[i].(string)},
			Attempts: keysAttempts[i+1].(int),
		}})
	}
	return rows
}

var testPolicy = settlePolicy{retry: idemq.Retry{MaxAttempts: 3, BaseDelay: time.Second, MaxDelay: time.Second}}

func TestDecideDeliversRetriesAndHoldsBackFollowers(t *testing.T) {
	rows := claimed("a", 0, "a", 0, "b", 0, "", 0)
	boom := errors.New("boom")
	d := decide(rows, map[int]error{0: boom, 1: ErrSkipped}, testPolicy)
	if len(d.delivered) != 2 || d.delivered[0].Key != "b" || d.delivered[1].Key != "" {
		t.Fatalf("delivered %+v", d.delivered)
	}
	if !slices.Equal(d.back.seqs, []int64{1, 2}) || !slices.Equal(d.back.attempts, []int32{1, 0}) {
		t.Fatalf("put back seqs %v attempts %v, want [1 2] [1 0]", d.back.seqs, d.back.attempts)
	}
	// The follower waits exactly as long as its head.
	if d.back.delays[1] != d.back.delays[0] || len(d.retried) != 1 || d.retried[0].Delay.Microseconds() != d.back.delays[0] {
		t.Fatalf("delays %v, retried %+v", d.back.delays, d.retried)
	}
	// Only the attempted row counts as failed; its follower was skipped.
	if len(d.failed) != 1 || len(d.skipped) != 1 || len(d.dead.seqs) != 0 {
		t.Fatalf("failed %d skipped %d dead %d", len(d.failed), len(d.skipped), len(d.dead.seqs))
	}
}

func TestDecideBuriesAfterLastAttemptOrPermanent(t *testing.T) {
	rows := claimed("a", 2, "a", 0, "b", 0, "b", 0)
	boom := errors.New("boom")
	for _, park := range []bool{false, true} {
		p := testPolicy
		p.park = park
		d := decide(rows, map[int]error{0: boom, 1: ErrSkipped, 2: idemq.Permanent(boom), 3: ErrSkipped}, p)
		if !slices.Equal(d.dead.seqs, []int64{1, 3}) || !slices.Equal(d.dead.attempts, []int32{3, 1}) {
			t.Fatalf("park %v: buried %v attempts %v", park, d.dead.seqs, d.dead.attempts)
		}
		if len(d.buried) != 2 || d.buried[0].Message.Attempts != 3 {
			t.Fatalf("park %v: buried events %+v", park, d.buried)
		}
		// Followers of a dead head: again at once, or parked.
		want := []int64{0, 0}
		var parkKeys []string
		if park {
			want = []int64{-1, -1}
			parkKeys = []string{"a", "b"}
		}
		if !slices.Equal(d.back.seqs, []int64{2, 4}) || !slices.Equal(d.back.delays, want) || !slices.Equal(d.parkKeys, parkKeys) {
			t.Fatalf("park %v: back %v delays %v park keys %v", park, d.back.seqs, d.back.delays, d.parkKeys)
		}
	}
}

// TestDecideHoldsSkippedRowsForTheirHint: a Sink that cannot take a
// destination now reports ErrSkipped with a RetryAfter hint; the row and
// its key's followers come back after the hint, without an attempt.
func TestDecideHoldsSkippedRowsForTheirHint(t *testing.T) {
	rows := claimed("a", 4, "a", 0)
	held := idemq.RetryAfter(ErrSkipped, time.Minute)
	d := decide(rows, map[int]error{0: held, 1: ErrSkipped}, testPolicy)
	if !slices.Equal(d.back.attempts, []int32{4, 0}) || !slices.Equal(d.back.delays, []int64{60e6, 60e6}) {
		t.Fatalf("attempts %v delays %v", d.back.attempts, d.back.delays)
	}
	if len(d.retried) != 0 || len(d.dead.seqs) != 0 {
		t.Fatalf("a held row counted as an attempt: %+v", d)
	}
}

func TestDecideRetryAfterHintExtendsTheBackoff(t *testing.T) {
	rows := claimed("", 0)
	d := decide(rows, map[int]error{0: idemq.RetryAfter(errors.New("busy"), time.Hour)}, testPolicy)
	if d.back.delays[0] != time.Hour.Microseconds() {
		t.Fatalf("delay %v, want the hint", time.Duration(d.back.delays[0])*time.Microsecond)
	}
}

func TestErrorTextIsStorable(t *testing.T) {
	if got := errorText(errors.New("a\x00b\xffc")); got != "abc" {
		t.Fatalf("errorText = %q, want %q", got, "abc")
	}
}
