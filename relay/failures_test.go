package relay_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"testing"

	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
)

func TestFailuresSkipsTheRestOfAFailedKey(t *testing.T) {
	t.Parallel()
	batch := []relay.Message{msg("", "a"), msg("", "a"), msg("", "b"), msg("", "a"), msg("", ""), msg("", "")}
	f := relay.NewFailures(batch)
	boom := errors.New("boom")
	for i := range batch {
		if f.Skip(i) {
			continue
		}
		if i == 1 || i == 4 {
			f.Fail(i, boom)
		}
	}
	var pe *relay.PublishError
	if err := f.Err(context.Background()); !errors.As(err, &pe) {
		t.Fatalf("Err: %v", err)
	}
	if got := slices.Sorted(maps.Keys(pe.Failed)); !slices.Equal(got, []int{1, 3, 4}) {
		t.Fatalf("failed %v, want [1 3 4]", got)
	}
	if !errors.Is(pe.Failed[3], relay.ErrSkipped) || pe.Failed[1] != boom || pe.Failed[4] != boom {
		t.Fatalf("errors %v", pe.Failed)
	}
	if f.Skip(0) {
		t.Fatal("a message before the failed one was skipped")
	}
}

func TestFailuresErr(t *testing.T) {
	t.Parallel()
	batch := []relay.Message{msg("", "a"), msg("", "b")}
	if err := relay.NewFailures(batch).Err(context.Background()); err != nil {
		t.Fatalf("nothing failed: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	f := relay.NewFailures(batch)
	f.Fail(0, ctx.Err())
	var pe *relay.PublishError
	if err := f.Err(ctx); !errors.As(err, &pe) {
		t.Fatalf("one of two failed: %v, want a PublishError", err)
	}
	f.Fail(1, ctx.Err())
	if err := f.Err(ctx); err != context.Canceled {
		t.Fatalf("all failed, ctx done: %v, want context.Canceled", err)
	}
	if err := f.Err(context.Background()); !errors.As(err, &pe) || len(pe.Failed) != 2 {
		t.Fatalf("all failed, ctx alive: %v, want a PublishError", err)
	}
}

// TestFailuresMergeTrustsOnlyWellFormedPublishErrors: a sub-sink's
// PublishError that names no failure or an index outside its sub-batch
// fails the whole sub-batch instead of passing it as delivered.
func TestFailuresMergeTrustsOnlyWellFormedPublishErrors(t *testing.T) {
	t.Parallel()
	batch := make([]relay.Message, 5)
	boom := errors.New("boom")
	for _, tc := range []struct {
		name string
		err  error
		want []int
	}{
		{"nil", nil, nil},
		{"plain", boom, []int{1, 3, 4}},
		{"partial", &relay.PublishError{Failed: map[int]error{1: boom}}, []int{3}},
		{"empty", &relay.PublishError{}, []int{1, 3, 4}},
		{"out of range", &relay.PublishError{Failed: map[int]error{3: boom}}, []int{1, 3, 4}},
		{"nil error", &relay.PublishError{Failed: map[int]error{0: nil}}, []int{1, 3, 4}},
	} {
		f := relay.NewFailures(batch)
		f.Merge([]int{1, 3, 4}, tc.err)
		var got []int
		for i := range batch {
			if f.Failed(i) != nil {
				got = append(got, i)
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: failed %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestRounds(t *testing.T) {
	t.Parallel()
	batch := []relay.Message{
		0: msg("x", "a"),
		1: msg("y", "b"),
		2: msg("x", "a"),
		3: msg("y", "a"), // a moves: round 1
		4: msg("z", ""),
		5: msg("y", "b"),
		6: msg("x", "a"), // a moves back: round 2
		7: msg("x", "c"),
	}
	got := relay.Rounds(batch, func(m *relay.Message) string { return m.Destination })
	want := [][]int{{0, 1, 2, 4, 5, 7}, {3}, {6}}
	if len(got) != len(want) {
		t.Fatalf("rounds %v, want %v", got, want)
	}
	for r := range want {
		if !slices.Equal(got[r], want[r]) {
			t.Fatalf("rounds %v, want %v", got, want)
		}
	}
	if r := relay.Rounds(nil, nil); len(r) != 0 {
		t.Fatalf("rounds of nothing: %v", r)
	}
}

// msg returns a message to dest with key.
func msg(dest, key string) relay.Message {
	return relay.Message{Message: outbox.Message{Destination: dest, Key: key}}
}
