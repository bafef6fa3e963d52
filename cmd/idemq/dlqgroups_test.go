package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestDLQGroups: dead letters the relay buried are grouped by class and
// destination; replay --group puts back exactly that group (a second replay
// finds no group and changes nothing), purge --group deletes one, --dry-run
// and an unknown group change nothing, and every move is in the audit log.
func TestDLQGroups(t *testing.T) {
	t.Parallel()
	url, ob, _ := deadLetters(t, "payments", "payments", "payments", "emails", "emails")
	ctx := context.Background()

	var groups []groupJSON
	mustJSON(t, url, &groups, "dlq", "groups")
	if len(groups) != 2 || groups[0].Destination != "payments" || groups[0].Count != 3 || groups[0].Class != "permanent: refused by the test" ||
		groups[1].Destination != "emails" || groups[1].Count != 2 {
		t.Fatalf("dlq groups: %+v", groups)
	}
	if out := mustRun(t, url, "dlq", "groups"); !strings.Contains(out, groups[0].ID) || !strings.Contains(out, "2 groups of outbox dead letters") {
		t.Errorf("dlq groups table:\n%s", out)
	}
	payments, emails := groups[0].ID, groups[1].ID

	var moved map[string]any
	mustJSON(t, url, &moved, "dlq", "replay", "--group", payments[:8], "--dry-run")
	if moved["would_have_replayed"] != float64(3) || deadCount(t, ob) != 5 {
		t.Fatalf("replay --dry-run: %v, %d dead left; want 3 and nothing changed", moved, deadCount(t, ob))
	}
	mustJSON(t, url, &moved, "dlq", "replay", "--group", payments)
	if moved["replayed"] != float64(3) || deadCount(t, ob) != 2 {
		t.Fatalf("replay --group: %v, %d dead left", moved, deadCount(t, ob))
	}
	wantCode(t, url, exitNotFound, "dlq", "replay", "--group", payments)
	wantCode(t, url, exitNotFound, "dlq", "purge", "--group", "abcdef012345")
	wantCode(t, url, exitUsage, "dlq", "purge", "--group", "abc")
	wantCode(t, url, exitUsage, "dlq", "replay", "--since", time.Now().Add(time.Hour).Format(time.RFC3339))
	mustJSON(t, url, &moved, "dlq", "purge", "--group", emails, "--yes")
	if moved["purged"] != float64(2) || deadCount(t, ob) != 0 {
		t.Fatalf("purge --group: %v, %d dead left", moved, deadCount(t, ob))
	}

	log, err := ob.AuditLog(ctx, 0, 10)
	if err != nil || len(log) != 2 {
		t.Fatalf("audit log %+v, %v; want the replay and the purge", log, err)
	}
	if log[0].Action != "outbox.purge" || log[0].Rows != 2 || log[0].Target != emails || !strings.HasPrefix(log[0].Actor, "cli:") ||
		log[1].Action != "outbox.replay" || log[1].Rows != 3 || !strings.Contains(string(log[1].Filter), `"error_class": "permanent: refused by the test"`) {
		t.Errorf("audit log %+v", log)
	}
}
