package main

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/testenv"
)

// TestMigrateValidateReportsTheSequence: validate reports the outbox's seq
// sequence and its CACHE, and fails (exit 1) with the statement that fixes
// it once the CACHE is above 1, which breaks the relay's order.
func TestMigrateValidateReportsTheSequence(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	mustRun(t, url, "migrate")
	var report struct {
		Sequences []struct {
			Sequence string `json:"sequence"`
			Cache    int64  `json:"cache"`
			Problem  string `json:"problem"`
		} `json:"sequences"`
	}
	mustJSON(t, url, &report, "migrate", "validate")
	if len(report.Sequences) != 1 || report.Sequences[0].Cache != 1 || report.Sequences[0].Problem != "" || report.Sequences[0].Sequence == "" {
		t.Fatalf("validate reports the sequences %+v, want the outbox's, CACHE 1, no problem", report.Sequences)
	}
	if out := mustRun(t, url, "migrate", "validate"); !strings.Contains(out, "CACHE 1") {
		t.Errorf("validate does not show the sequence's CACHE:\n%s", out)
	}

	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), `ALTER TABLE idemq_outbox ALTER COLUMN seq SET CACHE 20`); err != nil {
		t.Fatal(err)
	}
	r := wantCode(t, url, exitFailure, "migrate", "validate")
	if !strings.Contains(r.stdout, "CACHE 20") || !strings.Contains(r.stderr, "SET CACHE 1") {
		t.Errorf("validate with CACHE 20:\nstdout: %s\nstderr: %s\nwant the setting shown and the fix named", r.stdout, r.stderr)
	}
}
