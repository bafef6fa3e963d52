package main

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemq/idemq/idemqtest"
)

// TestUI: idemq ui serves the console (behind basic auth from the
// environment), the backlog gauges on /metrics and /healthz; actions are
// refused without --allow-actions; --allow-actions with nobody to sign in
// is a usage error; SIGTERM stops it cleanly.
func TestUI(t *testing.T) {
	t.Parallel()
	url0, _, _ := deadLetters(t, "payments", "payments")
	wantCode(t, url0, exitUsage, "ui", "--allow-actions", "--listen", freeAddr(t))

	addr := freeAddr(t)
	p := startEnv(t, env("DATABASE_URL="+url0, "IDEMQ_UI_USER=ops", "IDEMQ_UI_PASSWORD=pw"), "ui", "--listen", addr)
	base := "http://" + addr
	idemqtest.WaitForNoError(t, "the console", func() error {
		code, _, err := get(base + "/healthz")
		if err != nil || code != http.StatusOK {
			return fmt.Errorf("healthz: %d %v", code, err)
		}
		return nil
	})
	do := func(method, path string, auth bool, body url.Values) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if auth {
			req.SetBasicAuth("ops", "pw")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		_, _ = fmt.Fprint(&b, resp.Status)
		buf := make([]byte, 1<<16)
		for {
			n, err := resp.Body.Read(buf)
			b.Write(buf[:n])
			if err != nil {
				break
			}
		}
		return resp.StatusCode, b.String()
	}
	if code, _ := do(http.MethodGet, "/", false, nil); code != http.StatusUnauthorized {
		t.Errorf("GET / without auth: %d, want 401", code)
	}
	if code, body := do(http.MethodGet, "/dead", true, nil); code != http.StatusOK || !strings.Contains(body, "refused by the test") || strings.Contains(body, `name="csrf"`) {
		t.Errorf("GET /dead: %d\n%s", code, body)
	}
	if code, _ := do(http.MethodPost, "/actions/replay-group", true, url.Values{"group": {"abcdef"}}); code != http.StatusForbidden {
		t.Errorf("an action without --allow-actions: %d, want 403", code)
	}
	if code, body := do(http.MethodGet, "/metrics", false, nil); code != http.StatusOK || !strings.Contains(body, "idemq_outbox_partition_token") {
		t.Errorf("/metrics: %d\n%s", code, body)
	}
	if code := p.signal(t, syscall.SIGTERM, 10*time.Second); code != 0 {
		t.Errorf("idemq ui exited %d on SIGTERM", code)
	}
}

// TestUITokenName: IDEMQ_UI_TOKEN_NAME names the token's holder, as the
// page header (and the audit log) shows.
func TestUITokenName(t *testing.T) {
	t.Parallel()
	url0, _, _ := deadLetters(t, "payments", "payments")
	addr := freeAddr(t)
	startEnv(t, env("DATABASE_URL="+url0, "IDEMQ_UI_TOKEN=tok-1", "IDEMQ_UI_TOKEN_NAME=ops-bot"), "ui", "--listen", addr)
	var body string
	idemqtest.WaitForNoError(t, "the console", func() error {
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/", nil)
		req.Header.Set("Authorization", "Bearer tok-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET /: %d %v", resp.StatusCode, err)
		}
		body = string(b)
		return nil
	})
	if !strings.Contains(body, "signed in as ops-bot") {
		t.Errorf("GET / with the token does not name its holder:\n%s", body)
	}
}
