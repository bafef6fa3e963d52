package relay_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/relay"
)

// jsonLog is a JSON slog handler's output, kept for a test to read back.
type jsonLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *jsonLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *jsonLog) logger() *slog.Logger { return slog.New(slog.NewJSONHandler(l, nil)) }

// lines returns the JSON lines whose msg starts with msg, decoded.
func (l *jsonLog) lines(t *testing.T, msg string) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(l.buf.Bytes()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var rec map[string]any
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("log line %q is not JSON: %v", sc.Text(), err)
		}
		if m, _ := rec["msg"].(string); strings.HasPrefix(m, msg) {
			out = append(out, rec)
		}
	}
	return out
}

// TestRelayLogsTakeoverAndLoss: relay A owns every partition; its
// database goes away (a proxy in front of it stops), its heartbeat with
// it, and relay B takes A's partitions over once A's workers' rows
// expired. B's JSON log has one line "taken over" naming the partitions,
// their new tokens and, per partition, the worker it took it from (A's).
// Then A's database comes back: A finds it lost its partitions and logs
// one line "lost" naming them and, per partition, the new owner (B's
// worker) and its token.
//
// The JSON is what `idemq relay --log-format json` writes.
func TestRelayLogsTakeoverAndLoss(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, proxy, acfg := proxied(t)

	var logA, logB jsonLog
	rcfg := relay.Config{DisableListen: true, PollInterval: 20 * time.Millisecond, LeaseTTL: time.Second}
	rcfg.Logger = logA.logger()
	run(t, newRelay(t, bundle{ctx, openPool(t, acfg), b.ob}, &recorder{}, rcfg))
	waitFor(t, "A acquiring every partition", func() bool { return len(logA.lines(t, "relay: partitions acquired")) == 1 })
	workerA := logA.lines(t, "relay: partitions acquired")[0]["worker"].(string)

	proxy.Stop()
	rcfg.Logger = logB.logger()
	run(t, newRelay(t, b, &recorder{}, rcfg))
	waitFor(t, "B taking A's partitions over", func() bool { return len(logB.lines(t, "relay: partitions taken over")) > 0 })
	over := logB.lines(t, "relay: partitions taken over")
	if len(over) != 1 {
		t.Fatalf("%d lines for one takeover: %v", len(over), over)
	}
	line := over[0]
	workerB, _ := line["worker"].(string)
	parts, _ := line["partitions"].([]any)
	tokens, _ := line["tokens"].([]any)
	from, _ := line["from"].([]any)
	if line["level"] != "WARN" || workerB == "" || workerB == workerA || len(parts) != 64 || len(tokens) != 64 || len(from) != 2*64 {
		t.Fatalf("takeover line %v: want WARN, B's worker, 64 partitions and tokens, and (partition, previous owner) per partition", line)
	}
	for i := range parts {
		if tokens[i] != 2.0 { // A's take was 1
			t.Errorf("partition %v taken over with token %v, want 2", parts[i], tokens[i])
		}
		if from[2*i] != parts[i] || from[2*i+1] != workerA {
			t.Errorf("partition %v taken over from %v %v, want from A's worker %s", parts[i], from[2*i], from[2*i+1], workerA)
		}
	}

	proxy.Start()
	waitFor(t, "A noticing its loss", func() bool { return len(logA.lines(t, "relay: partitions lost")) > 0 })
	lost := logA.lines(t, "relay: partitions lost")
	if len(lost) != 1 {
		t.Fatalf("%d lines for one loss: %v", len(lost), lost)
	}
	line = lost[0]
	parts, _ = line["partitions"].([]any)
	now, _ := line["now"].([]any)
	// By the time A looks, B may have given up half of them for A to
	// take back (A then loses only the others), or released some that
	// nobody took yet.
	if line["level"] != "WARN" || line["worker"] != workerA || len(parts) < 32 || len(now) != 3*len(parts) {
		t.Fatalf("loss line %v: want WARN, A's worker, at least 32 partitions, and (partition, owner, token) per partition", line)
	}
	byB := 0
	for i := range parts {
		got := fmt.Sprint(now[3*i : 3*i+3])
		if got == fmt.Sprint([]any{parts[i], workerB, 2.0}) {
			byB++
		} else if got != fmt.Sprint([]any{parts[i], "nobody", 2.0}) {
			t.Errorf("partition %v now %s, want B's worker %s with token 2", parts[i], got, workerB)
		}
	}
	if byB == 0 {
		t.Errorf("loss line names B as the owner of no partition: %v", line)
	}
}
