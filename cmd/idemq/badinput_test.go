package main

// The bad-input suite of the binary: each test gives idemq what a careless
// user or a tired operator would, and checks that it answers with the
// documented exit code and an error that says what to do, and that nothing
// was deleted or changed that was not asked for. Add a case here for each
// new flag or command.

import (
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/idemq/idemq/outbox"
)

// deadLetters enqueues one message per destination and turns them all into
// dead letters; it returns their ids.
func deadLetters(t *testing.T, dests ...string) (url string, ob *outbox.Outbox, ids []string) {
	t.Helper()
	url, pool, ob := database(t)
	for _, dest := range dests {
		m := outbox.Message{ID: uuid.Must(uuid.NewV7()), Destination: dest, Key: dest, Payload: []byte(`{}`)}
		if err := ob.Enqueue(context.Background(), m); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, m.ID.String())
	}
	deadLetter(t, pool, ob, len(dests))
	return url, ob, ids
}

// deadCount is the number of outbox dead letters.
func deadCount(t *testing.T, ob *outbox.Outbox) int64 {
	t.Helper()
	s, err := ob.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return s.Dead
}

// TestDLQNegativeAgeIsAUsageError: a negative (or zero) --older-than or
// --newer-than used to be dropped, so that purge deleted every dead
// letter. It is a usage error, for the outbox and the inbox, in every dlq
// command, and nothing is touched.
func TestDLQNegativeAgeIsAUsageError(t *testing.T) {
	t.Parallel()
	url, ob, _ := deadLetters(t, "payments", "emails")
	for _, args := range [][]string{
		{"dlq", "purge", "--older-than", "-1h"},
		{"dlq", "purge", "--newer-than", "-1h"},
		{"dlq", "purge", "--older-than", "0s"},
		{"dlq", "purge", "--inbox", "--older-than", "-1h"},
		{"dlq", "purge", "--inbox", "--conflicts", "--newer-than", "-1m"},
		{"dlq", "replay", "--older-than", "-1h"},
		{"dlq", "replay", "--inbox", "--newer-than", "-1h"},
		{"dlq", "list", "--older-than", "-1h"},
	} {
		r := wantCode(t, url, exitUsage, args...)
		if !strings.Contains(r.stderr, "positive age") {
			t.Errorf("idemq %v: stderr %q does not say an age must be positive", args, r.stderr)
		}
	}
	if n := deadCount(t, ob); n != 2 {
		t.Fatalf("%d dead letters left, want the 2 nothing was asked to touch", n)
	}
}

// TestDLQPurgeNeedsAFilterOrAll: purge with no filter is refused; --all
// with a filter is refused; --dry-run lists and counts what would go and
// changes nothing; --all purges everything.
func TestDLQPurgeNeedsAFilterOrAll(t *testing.T) {
	t.Parallel()
	url, ob, ids := deadLetters(t, "payments", "payments", "emails")
	for _, args := range [][]string{
		{"dlq", "purge"},
		{"dlq", "purge", "--inbox"},
		{"dlq", "purge", "--inbox", "--conflicts"},
		{"dlq", "purge", "--limit", "1"},
		{"dlq", "purge", "--all", "--destination", "emails"},
		{"dlq", "replay", "--all", "--destination", "emails"},
	} {
		wantCode(t, url, exitUsage, args...)
	}
	if n := deadCount(t, ob); n != 3 {
		t.Fatalf("%d dead letters after refused purges, want 3", n)
	}

	out := mustRun(t, url, "dlq", "purge", "--all", "--dry-run")
	for _, id := range ids {
		if !strings.Contains(out, id) {
			t.Errorf("purge --dry-run does not list %s:\n%s", id, out)
		}
	}
	if !strings.Contains(out, "would have purged 3 outbox dead letters (all of them); nothing changed") {
		t.Errorf("purge --dry-run does not give the count:\n%s", out)
	}
	var dry struct {
		N    int64            `json:"would_have_purged"`
		Dead []deadLetterJSON `json:"dead_letters"`
	}
	mustJSON(t, url, &dry, "dlq", "purge", "--destination", "payments", "--dry-run")
	if dry.N != 2 || len(dry.Dead) != 2 {
		t.Errorf("purge --destination payments --dry-run --json: %+v, want 2 listed and counted", dry)
	}
	var replayDry map[string]any
	mustJSON(t, url, &replayDry, "dlq", "replay", "--dry-run")
	if replayDry["would_have_replayed"] != float64(3) {
		t.Errorf("replay --dry-run: %v, want 3", replayDry)
	}
	if n := deadCount(t, ob); n != 3 {
		t.Fatalf("%d dead letters after dry runs, want 3", n)
	}

	// Standard input is not a terminal here: no question is asked.
	var moved map[string]int64
	mustJSON(t, url, &moved, "dlq", "purge", "--all")
	if moved["purged"] != 3 || deadCount(t, ob) != 0 {
		t.Fatalf("purge --all: %v, %d left; want 3 purged", moved, deadCount(t, ob))
	}
}

// TestDLQReplayOfAMissingIDChangesNothing: replay --id A --id B where B is
// no dead letter names B, exits 5 and replays nothing, A included.
func TestDLQReplayOfAMissingIDChangesNothing(t *testing.T) {
	t.Parallel()
	url, ob, ids := deadLetters(t, "payments", "emails")
	missing := uuid.Must(uuid.NewV7()).String()
	for _, verb := range []string{"replay", "purge"} {
		r := wantCode(t, url, exitNotFound, "dlq", verb, "--id", ids[0], "--id", missing)
		if !strings.Contains(r.stderr, missing) || strings.Contains(r.stderr, ids[0]) {
			t.Errorf("dlq %s: stderr %q, want it to name %s alone", verb, r.stderr, missing)
		}
		// An id that exists but that another filter excludes is missing too.
		wantCode(t, url, exitNotFound, "dlq", verb, "--id", ids[0], "--destination", "emails")
	}
	if n := deadCount(t, ob); n != 2 {
		t.Fatalf("%d dead letters after refused replays, want 2", n)
	}
	var moved map[string]int64
	mustJSON(t, url, &moved, "dlq", "replay", "--id", ids[0], "--id", ids[1])
	if moved["replayed"] != 2 {
		t.Fatalf("replay of two existing ids: %v", moved)
	}
}
