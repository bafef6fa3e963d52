package relay_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/outbox"
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
	idemqtest.WaitFor(t, "A acquiring every partition", func() bool { return len(logA.lines(t, "relay: partitions acquired")) == 1 })
	workerA := logA.lines(t, "relay: partitions acquired")[0]["worker"].(string)

	proxy.Stop()
	rcfg.Logger = logB.logger()
	run(t, newRelay(t, b, &recorder{}, rcfg))
	idemqtest.WaitFor(t, "B taking A's partitions over", func() bool { return len(logB.lines(t, "relay: partitions taken over")) > 0 })
	over := logB.lines(t, "relay: partitions taken over")
	if len(over) != 1 {
		t.Fatalf("%d lines for one takeover: %v", len(over), over)
	}
	line := over[0]
	workerB, _ := line["worker"].(string)
	// The 64 partitions are a span, not an array: A's take was token 1.
	if line["level"] != "WARN" || workerB == "" || workerB == workerA || line["partitions"] != "0-63" || line["tokens"] != "2" ||
		line["from"] != workerA+":0-63" {
		t.Fatalf("takeover line %v: want WARN, B's worker, partitions 0-63 at token 2, taken from A's worker %s", line, workerA)
	}

	proxy.Start()
	idemqtest.WaitFor(t, "A noticing its loss", func() bool { return len(logA.lines(t, "relay: partitions lost")) > 0 })
	lost := logA.lines(t, "relay: partitions lost")
	if len(lost) != 1 {
		t.Fatalf("%d lines for one loss: %v", len(lost), lost)
	}
	line = lost[0]
	// By the time A looks, B may have given up half of them for A to
	// take back (A then loses only the others), or released some that
	// nobody took yet.
	now, _ := line["now"].(string)
	if line["level"] != "WARN" || line["worker"] != workerA || line["tokens"] != "2" || !strings.Contains(now, workerB+":") {
		t.Fatalf("loss line %v: want WARN, A's worker, B's worker (%s) among the owners, token 2", line, workerB)
	}
	covered := 0
	for owner := range strings.FieldsSeq(now) {
		who, parts, _ := strings.Cut(owner, ":")
		if who != workerB && who != "nobody" {
			t.Errorf("loss line names owner %q, want B's worker or nobody", who)
		}
		covered += spanCount(t, parts)
	}
	if lostParts := spanCount(t, line["partitions"].(string)); lostParts < 32 || covered != lostParts {
		t.Errorf("loss line %v: %d partitions lost and %d with an owner, want at least 32 and the same", line, lostParts, covered)
	}
}

// spanCount counts the numbers in spans like "0-31,33".
func spanCount(t *testing.T, spans string) int {
	t.Helper()
	n := 0
	for s := range strings.SplitSeq(spans, ",") {
		lo, hi, ok := strings.Cut(s, "-")
		if !ok {
			hi = lo
		}
		a, err1 := strconv.Atoi(lo)
		b, err2 := strconv.Atoi(hi)
		if err1 != nil || err2 != nil || b < a {
			t.Fatalf("bad spans %q", spans)
		}
		n += b - a + 1
	}
	return n
}

// A relay whose heartbeat lapses during a batch (its database went away
// while the Sink published) lets the batch's rows go and says so: the
// line names the lost leases, not a database outage; the outage that
// follows is its own line, without "lease lost" in it. Lines name the
// outbox as schema.table, not as an escaped SQL identifier.
func TestRelayLogsFencedBatchAsSuch(t *testing.T) {
	t.Parallel()
	b, proxy, acfg := proxied(t)
	var log jsonLog
	inFlight := make(chan struct{}, 1)
	sink := relay.SinkFunc(func(ctx context.Context, _ relay.BatchID, _ []relay.Message) error {
		select {
		case inFlight <- struct{}{}:
		default:
		}
		<-ctx.Done() // the fence ends it once the heartbeat lapsed
		return ctx.Err()
	})
	run(t, newRelay(t, bundle{b.ctx, openPool(t, acfg), b.ob}, sink, relay.Config{
		DisableListen: true, PollInterval: 20 * time.Millisecond, LeaseTTL: 500 * time.Millisecond, Logger: log.logger()}))
	enqueue(t, b, outbox.Message{Destination: "d", Key: "k"})
	select {
	case <-inFlight:
	case <-time.After(30 * time.Second):
		t.Fatal("no batch reached the sink in 30s")
	}
	proxy.Stop()
	idemqtest.WaitFor(t, "the fenced batch logged", func() bool { return len(log.lines(t, "relay: a batch let its claimed rows go")) > 0 })
	line := log.lines(t, "relay: a batch let its claimed rows go")[0]
	if err, _ := line["err"].(string); line["level"] != "WARN" || !strings.Contains(err, "lease lost") {
		t.Errorf("fenced line %v: want WARN with the lease's error", line)
	}
	// The outbox is named plainly, not as a quoted SQL identifier.
	if want := b.ob.Config().Schema + "." + b.ob.Config().Table; line["outbox"] != want {
		t.Errorf("fenced line names outbox %q, want %q", line["outbox"], want)
	}
	idemqtest.WaitFor(t, "the outage logged", func() bool { return len(log.lines(t, "relay: database unavailable")) > 0 })
	for _, l := range log.lines(t, "relay: database unavailable") {
		if err, _ := l["err"].(string); strings.Contains(err, "lease lost") {
			t.Errorf("a lost lease logged as a database outage: %v", l)
		}
	}
}
