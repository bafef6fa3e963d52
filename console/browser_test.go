package console_test

import (
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/idemq/idemq/console"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/testenv"
)

// TestBrowser drives the console in a real headless Chromium as an
// operator would: the overview while a relay drains, a group of dead
// letters appearing when a sink fails, a purge that asks first (rows,
// filter) and is cancelled, the group's replay once the sink works again,
// confirmed on its second page (the rows get delivered, with their ids),
// the audit entry; and a
// browser without credentials sent to the login page. It saves a
// screenshot of each page in IDEMQ_SCREENSHOT_DIR, or a temporary
// directory.
func TestBrowser(t *testing.T) {
	t.Parallel()
	chromium := testenv.Chromium(t)
	e := setup(t, console.Config{AllowActions: true, User: user, Password: password, Token: token})
	s := &sink{failing: map[string]string{"hooks": "webhook: endpoint ep-1: HTTP 503: busy (message ID)"}}
	dead, _ := e.runRelay(t, s)
	e.enqueue(t, "orders", 20)
	hookIDs := e.enqueue(t, "hooks", 5)

	shots := os.Getenv("IDEMQ_SCREENSHOT_DIR")
	if shots == "" {
		shots = t.TempDir()
	}
	if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}
	opts := append(slices.Clone(chromedp.DefaultExecAllocatorOptions[:]),
		chromedp.ExecPath(chromium),
		chromedp.UserDataDir(profileDir(t)),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.WindowSize(1400, 1000),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(e.ctx, opts...)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(allocCtx)
	defer cancel()
	ctx, cancelTimeout := context.WithTimeout(ctx, 90*time.Second)
	defer cancelTimeout()

	shot := func(name string) chromedp.Action {
		return chromedp.ActionFunc(func(ctx context.Context) error {
			var png []byte
			if err := chromedp.FullScreenshot(&png, 100).Do(ctx); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(shots, name+".png"), png, 0o644)
		})
	}
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + password))
	base := e.srv.URL
	var overview, groupsText string
	if err := chromedp.Run(ctx,
		network.Enable(),
		network.SetExtraHTTPHeaders(network.Headers{"Authorization": "Basic " + auth}),
		chromedp.Navigate(base+"/"),
		chromedp.WaitVisible(`h1`),
		chromedp.Text(`main`, &overview),
		shot("overview"),
	); err != nil {
		t.Fatalf("overview: %v", err)
	}
	if !strings.Contains(overview, "rows waiting in the outbox") {
		t.Fatalf("overview shows:\n%s", overview)
	}

	waitFor(t, "the hooks messages to become dead letters", func() bool { return dead.Load() >= 5 })
	groups, err := e.ob.DeadGroups(e.ctx, outbox.DeadFilter{})
	if err != nil || len(groups) != 1 || groups[0].Count != 5 {
		t.Fatalf("groups %+v, %v", groups, err)
	}
	if err := chromedp.Run(ctx,
		chromedp.Click(`#nav-dead`, chromedp.ByQuery),
		chromedp.WaitVisible(`#groups`, chromedp.ByQuery),
		chromedp.Text(`#groups`, &groupsText, chromedp.ByQuery),
		shot("dead-letters"),
	); err != nil {
		t.Fatalf("dead letters: %v", err)
	}
	if !strings.Contains(groupsText, "http 5xx") || !strings.Contains(groupsText, "hooks") {
		t.Fatalf("the groups table shows:\n%s", groupsText)
	}

	// A purge asks first: the confirm page says how many rows and which
	// filter; cancelling changes nothing.
	var confirmText string
	if err := chromedp.Run(ctx,
		chromedp.Click(`#purge-`+groups[0].ID, chromedp.ByQuery),
		chromedp.WaitVisible(`#confirm`, chromedp.ByQuery),
		chromedp.Text(`main`, &confirmText, chromedp.ByQuery),
		shot("confirm-purge"),
		chromedp.Click(`#cancel`, chromedp.ByQuery),
		chromedp.WaitVisible(`#groups`, chromedp.ByQuery),
	); err != nil {
		t.Fatalf("purge, then cancel: %v", err)
	}
	if !strings.Contains(confirmText, "5 rows match now") || !strings.Contains(confirmText, "deleted for good") || !strings.Contains(confirmText, "hooks") {
		t.Fatalf("the purge's confirm page shows:\n%s", confirmText)
	}
	if st, err := e.ob.Stats(e.ctx); err != nil || st.Dead != 5 {
		t.Fatalf("after a cancelled purge: %+v, %v; want the 5 dead letters", st, err)
	}

	s.heal("hooks")
	var flash string
	if err := chromedp.Run(ctx,
		chromedp.Click(`#replay-`+groups[0].ID, chromedp.ByQuery),
		chromedp.WaitVisible(`#confirm`, chromedp.ByQuery),
		shot("confirm-replay"),
		chromedp.Click(`#confirm`, chromedp.ByQuery),
		chromedp.WaitVisible(`#flash`, chromedp.ByQuery),
		chromedp.Text(`#flash`, &flash, chromedp.ByQuery),
		shot("replayed"),
	); err != nil {
		t.Fatalf("replay: %v", err)
	}
	if !strings.Contains(flash, "replayed 5 dead letters") {
		t.Fatalf("after replay the page says %q", flash)
	}
	waitFor(t, "the replayed messages delivered", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, id := range hookIDs {
			if !slices.Contains(s.published, id) {
				return false
			}
		}
		return true
	})

	var audit string
	if err := chromedp.Run(ctx,
		chromedp.Click(`#nav-audit`, chromedp.ByQuery),
		chromedp.WaitVisible(`#audit`, chromedp.ByQuery),
		chromedp.Text(`#audit`, &audit, chromedp.ByQuery),
		shot("audit"),
		chromedp.Navigate(base+"/lookup?key=hooks-key-0"),
		chromedp.WaitVisible(`h1`),
		shot("lookup"),
	); err != nil {
		t.Fatalf("audit: %v", err)
	}
	if !strings.Contains(audit, "outbox.replay") || !strings.Contains(audit, "ui:alice") {
		t.Fatalf("the audit page shows:\n%s", audit)
	}

	// Another tab, without the credentials header, lands on the login page.
	other, cancelOther := chromedp.NewContext(ctx)
	defer cancelOther()
	var url string
	if err := chromedp.Run(other,
		chromedp.Navigate(base+"/dead"),
		chromedp.WaitVisible(`input[name="token"]`, chromedp.ByQuery),
		chromedp.Location(&url),
		shot("login"),
	); err != nil {
		t.Fatalf("without credentials: %v", err)
	}
	if !strings.HasSuffix(url, "/login") {
		t.Errorf("without credentials the browser is at %s, want the login page", url)
	}
	t.Logf("screenshots in %s", shots)
}

// profileDir is an empty Chromium profile directory, removed at cleanup
// once the browser's helper processes stopped writing to it (t.TempDir
// fails the test when they are late).
func profileDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "idemq-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for range 50 {
			if os.RemoveAll(dir) == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("left %s behind: the browser still writes to it", dir)
	})
	return dir
}
