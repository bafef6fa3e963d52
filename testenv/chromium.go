package testenv

import (
	"os"
	"os/exec"
	"testing"
)

// chromiumHelp says how to get the browser the console's browser test
// drives.
const chromiumHelp = `install it (Debian/Ubuntu: apt-get install -y chromium; make test does it when missing), or point IDEMQ_TEST_CHROMIUM at a Chrome or Chromium binary`

// Chromium returns the path of a Chrome or Chromium binary for browser
// tests: IDEMQ_TEST_CHROMIUM, else chromium, chromium-browser or
// google-chrome on PATH, else /usr/bin/chromium. A missing browser fails
// tb with a message saying how to install it; it never skips.
func Chromium(tb testing.TB) string {
	tb.Helper()
	if p := os.Getenv("IDEMQ_TEST_CHROMIUM"); p != "" {
		if _, err := os.Stat(p); err != nil {
			tb.Fatalf("testenv: IDEMQ_TEST_CHROMIUM=%s: %v; %s", p, err, chromiumHelp)
		}
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if _, err := os.Stat("/usr/bin/chromium"); err == nil {
		return "/usr/bin/chromium"
	}
	tb.Fatalf("testenv: no Chromium found; %s", chromiumHelp)
	return ""
}
