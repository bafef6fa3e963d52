package relay_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/idemq/idemq/relay/relaytest/history"
)

// The linearizability check of the partition leases: each partition's
// lease is a register whose fencing token only grows. A take grants a
// larger token; a publish with a token must happen while that token is
// the partition's latest grant, never after a larger one was granted.
// TestRelayHistory feeds its recorded grants and publishes to it.

// grant is a take of a partition's lease, as the recorder's trigger saw
// it: At is when the take wrote the token, Committed when its transaction
// committed (the grant took effect in between).
type grant struct {
	Part      int32
	Token     int64
	At        time.Time
	Committed time.Time
}

// leaseOp is a grant of token or a publish with it, by relay ("" for a
// grant).
type leaseOp struct {
	publish bool
	token   int64
	relay   string
}

// leaseModel is the sequential specification of one partition's lease:
// its state is the latest token granted.
var leaseModel = porcupine.Model{
	Init: func() any { return int64(0) },
	Step: func(st, input, _ any) (bool, any) {
		granted, op := st.(int64), input.(leaseOp)
		if op.publish {
			return op.token == granted, granted
		}
		return op.token > granted, op.token
	},
	DescribeOperation: func(input, _ any) string {
		op := input.(leaseOp)
		if op.publish {
			return fmt.Sprintf("Publish(%d) by %s", op.token, op.relay)
		}
		return fmt.Sprintf("Grant(%d)", op.token)
	},
	DescribeState: func(st any) string { return fmt.Sprintf("token %d", st.(int64)) },
}

// leaseHistories partitions the grants and the publishes of keyed
// messages per partition, as porcupine operations: a grant spans its
// write and its commit, a publish is the instant it was recorded.
func leaseHistories(grants []grant, published []history.Publish) map[int][]porcupine.Operation {
	parts := map[int][]porcupine.Operation{}
	for _, g := range grants {
		parts[int(g.Part)] = append(parts[int(g.Part)], porcupine.Operation{
			Input: leaseOp{token: g.Token}, Call: g.At.UnixNano(), Return: g.Committed.UnixNano()})
	}
	var relays []string
	for _, p := range published {
		if p.Partition < 0 {
			continue // unkeyed: no lease
		}
		client := slices.Index(relays, p.Relay)
		if client < 0 {
			client, relays = len(relays), append(relays, p.Relay)
		}
		at := p.At.UnixNano()
		parts[p.Partition] = append(parts[p.Partition], porcupine.Operation{
			ClientId: client + 1, Input: leaseOp{publish: true, token: p.LeaseToken, relay: p.Relay}, Call: at, Return: at})
	}
	return parts
}

// checkLeases checks every partition's history against the model and
// returns the partitions whose history is not linearizable, each written
// as porcupine's HTML visualization into dir (if "", a new directory that
// outlives the test).
func checkLeases(t *testing.T, parts map[int][]porcupine.Operation, dir string) (illegal []string) {
	t.Helper()
	ops, grants := 0, 0
	for part, h := range parts {
		ops += len(h)
		for _, op := range h {
			if !op.Input.(leaseOp).publish {
				grants++
			}
		}
		res, info := porcupine.CheckOperationsVerbose(leaseModel, h, time.Minute)
		switch res {
		case porcupine.Illegal:
			if dir == "" {
				var err error
				if dir, err = os.MkdirTemp("", "idemq-lease-linearizability-"); err != nil {
					t.Fatal(err)
				}
			}
			path := filepath.Join(dir, fmt.Sprintf("partition-%d.html", part))
			if err := porcupine.VisualizePath(leaseModel, info, path); err != nil {
				t.Errorf("visualizing partition %d: %v", part, err)
			}
			illegal = append(illegal, fmt.Sprintf("partition %d (%d operations; see %s)", part, len(h), path))
		case porcupine.Unknown:
			t.Logf("partition %d: the check of %d operations timed out", part, len(h))
		}
	}
	t.Logf("leases: %d grants and %d publishes on %d partitions checked", grants, ops-grants, len(parts))
	return illegal
}

// TestLeaseCheckCatchesStaleOwner: the check accepts a publish racing the
// commit of the take that fences it out, and finds out a publish with a
// token after a larger one was granted, writing the visualization, so a
// pass of TestRelayHistory means something.
func TestLeaseCheckCatchesStaleOwner(t *testing.T) {
	t.Parallel()
	at := func(ms int) time.Time { return time.Unix(0, 0).Add(time.Duration(ms) * time.Millisecond) }
	grants := []grant{{Part: 7, Token: 1, At: at(0), Committed: at(1)}, {Part: 7, Token: 2, At: at(10), Committed: at(12)}}
	published := []history.Publish{
		{Relay: "relay0.1", Partition: 7, LeaseToken: 1, At: at(5)},
		{Relay: "relay0.1", Partition: 7, LeaseToken: 1, At: at(11)}, // before the take committed
		{Relay: "relay1.1", Partition: 7, LeaseToken: 2, At: at(13)},
		{Relay: "relay2.1", Partition: -1, At: at(14)}, // unkeyed
	}
	if illegal := checkLeases(t, leaseHistories(grants, published), t.TempDir()); len(illegal) > 0 {
		t.Fatalf("a legal history was refused: %v", illegal)
	}
	stale := append(published, history.Publish{Relay: "relay0.1", Partition: 7, LeaseToken: 1, At: at(15)})
	dir := t.TempDir()
	illegal := checkLeases(t, leaseHistories(grants, stale), dir)
	if len(illegal) != 1 {
		t.Fatalf("a publish with token 1 after token 2 was granted: %v, want partition 7 refused", illegal)
	}
	if _, err := os.Stat(filepath.Join(dir, "partition-7.html")); err != nil {
		t.Fatalf("no visualization of the refused partition: %v", err)
	}
}
