package franz

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/lifecycle"
	"github.com/idemq/idemq/relay"
)

// The defaults of [TxConfig].
const (
	// TransactionTimeoutDefault is how long the broker lets a transaction
	// stay open before it aborts it (a relay that died mid-transaction
	// and whose partition nobody took over yet).
	TransactionTimeoutDefault = time.Minute
	// WatermarkPartitionsDefault is the partition count of a watermark
	// topic the TxSink creates: one per outbox key partition, so that no
	// partition's open transaction holds back the read of another's
	// watermark.
	WatermarkPartitionsDefault = 64
)

// ErrFenced is matched by the error of a transaction that Kafka refused
// because a newer producer with the same transactional id exists
// (ProducerFenced, an invalid epoch), or that the TxSink did not start
// because a newer lease token of the partition was seen: the partition's
// lease moved to another relay worker. The relay retries the messages
// under whoever owns the partition now.
var ErrFenced = errors.New("idemq/franz: fenced: a newer owner of the outbox partition has its transactional id")

// TxConfig configures a [TxSink].
type TxConfig struct {
	// SinkConfig maps destinations to topics and names the id header, as
	// for a [Sink].
	SinkConfig
	// Outbox names the outbox whose rows the TxSink publishes, as
	// relay.OutboxName gives it. Every watermark record carries it, and a
	// watermark of another outbox under this TxSink's transactional ids
	// is refused (an error from [TxSink.Watermark]), never applied: its
	// seqs are another outbox's, and the relay would delete this
	// outbox's rows of the same seqs unpublished. Required.
	Outbox string
	// TransactionalIDPrefix prefixes the transactional.id of each outbox
	// key partition: partition 7's is TransactionalIDPrefix + "7". It
	// must be unique to one outbox (every relay of that outbox uses the
	// same prefix, and no other producer). Defaults to the prefix
	// [TxNames] derives from Outbox.
	TransactionalIDPrefix string
	// WatermarkTopic receives each transaction's watermark record (key:
	// the transactional id; value: the outbox, its partition, the highest
	// seq, the lease token and the seqs delivered). It should be
	// compacted; the TxSink creates it (compacted,
	// [WatermarkPartitionsDefault] partitions) when it does not exist.
	// A topic name Kafka accepts. Defaults to the topic [TxNames] derives
	// from Outbox.
	WatermarkTopic string
	// TransactionTimeout is the broker's bound on an open transaction
	// (transaction.timeout.ms, at most the broker's
	// transaction.max.timeout.ms). Defaults to
	// [TransactionTimeoutDefault].
	TransactionTimeout time.Duration
	// Test holds crash points for tests; leave it zero in production.
	Test TxTestConfig
}

// TxTestConfig holds a [TxSink]'s crash points, for tests and chaos
// drills.
type TxTestConfig struct {
	// BeforeCommit, if set, runs after a transaction's records were
	// flushed and before it commits; a non-nil error aborts the
	// transaction instead.
	BeforeCommit func(ctx context.Context, partition int, token int64) error
}

// TxSink is a [relay.Sink] that publishes each outbox key partition's
// share of a batch as one Kafka transaction, fenced by the relay's
// partition leases, so that a consumer reading committed data
// (isolation.level=read_committed) sees every outbox message exactly once,
// across relay crashes, lease moves and broker errors:
//
//   - partition p has the transactional id TransactionalIDPrefix + p, and
//     one idempotent kgo client of its own per TxSink;
//   - when a relay worker takes p under a new lease token, the relay
//     calls [TxSink.Watermark], whose InitProducerID bumps the epoch of
//     p's transactional id: the previous owner's open transaction is
//     aborted, and its later produce or commit is refused
//     (ProducerFenced, see [ErrFenced]);
//   - each transaction holds the messages and a watermark record
//     (partition, highest seq, lease token, the seqs delivered) on
//     WatermarkTopic; Watermark returns the last committed one, and the
//     relay deletes the rows it names without publishing them: rows
//     a crash between the Kafka commit and the outbox delete left
//     behind (see [relay.Watermarker]);
//   - an abort (a failed record, a lost lease, a broker error) leaves
//     nothing visible to read_committed consumers.
//
// Messages without a key (Partition -1), which no lease covers, go
// through a plain idempotent producer: at least once, like a [Sink].
//
// It follows franz-go's transaction rules: records are flushed before
// EndTransaction, whose context is never cancelled; a commit that was not
// attempted (OperationNotAttempted) is aborted; a transaction that failed
// before its commit is aborted and the client kept; after a fenced
// producer or a commit whose outcome is unknown the client is closed, and
// the partition's next use initialises a new one (bumping the epoch, which
// aborts anything left open) and reads the watermark again.
//
// Per-key order: a transaction holds all of a partition's messages of the
// batch, in batch order, and commits or aborts as a whole; messages that
// fail the checks before it (no topic, too large) and the later messages
// of their keys are left out of it.
//
// A TxSink is safe for concurrent use: transactions of one partition run
// one at a time, those of different partitions concurrently. Close it
// when done.
type TxSink struct {
	cfg   TxConfig
	opts  []kgo.Opt // the user's and the producer options
	plain *kgo.Client

	mu      sync.Mutex
	parts   map[int]*txPartition
	wmParts int32 // partitions of WatermarkTopic; 0 until known
	closed  bool
}

// txPartition is the producer of one outbox key partition.
type txPartition struct {
	mu    sync.Mutex // one transaction at a time
	cl    *kgo.Client
	token int64 // the highest lease token seen
	last  relay.Watermark
	known bool // last is the partition's last committed watermark
	// batch is the relay batch of the last transaction: the next
	// transaction of the same batch names the rows of both in its
	// watermark.
	batch relay.BatchID
}

// NewTxSink returns a TxSink whose clients are made of opts (at least
// kgo.SeedBrokers; TLS, SASL, client id as needed) and the producer and
// transaction options it needs, which come last and win. It does not
// contact the brokers.
func NewTxSink(cfg TxConfig, opts ...kgo.Opt) (*TxSink, error) {
	const c = "franz.TxSink"
	if cfg.Outbox == "" {
		return nil, idemq.NewConfigError(c, "Outbox", "is empty: name the outbox (relay.OutboxName), so that its watermarks are told from another outbox's")
	}
	prefix, topic := TxNames(cfg.Outbox)
	cfg.TransactionalIDPrefix = cmp.Or(cfg.TransactionalIDPrefix, prefix)
	cfg.WatermarkTopic = cmp.Or(cfg.WatermarkTopic, topic)
	cfg.SinkConfig = cfg.SinkConfig.withDefaults()
	cfg.TransactionTimeout = cmp.Or(cfg.TransactionTimeout, TransactionTimeoutDefault)
	if cfg.TransactionTimeout < time.Second {
		return nil, idemq.NewConfigError(c, "TransactionTimeout", "%v is below a second", cfg.TransactionTimeout)
	}
	if err := checkTopic(c, "WatermarkTopic", cfg.WatermarkTopic); err != nil {
		return nil, err
	}
	if err := cfg.SinkConfig.validate(c); err != nil {
		return nil, err
	}
	cfg.SinkConfig.manualTopic = cfg.WatermarkTopic
	all := append(append([]kgo.Opt{}, opts...), producerOpts(cfg.SinkConfig)...)
	plain, err := kgo.NewClient(all...)
	if err != nil {
		return nil, idemq.NewConfigError(c, "opts", "kgo refuses them: %v", err)
	}
	return &TxSink{cfg: cfg, opts: all, plain: plain, parts: map[int]*txPartition{}}, nil
}

var (
	_ relay.Sink        = (*TxSink)(nil)
	_ relay.Watermarker = (*TxSink)(nil)
)

// TransactionalID returns the transactional id of outbox key partition p.
func (s *TxSink) TransactionalID(p int) string {
	return s.cfg.TransactionalIDPrefix + strconv.Itoa(p)
}

// Close closes every client; open transactions (there are none outside
// Publish) are aborted by the broker.
func (s *TxSink) Close() {
	s.mu.Lock()
	s.closed = true
	parts := s.parts
	s.parts = map[int]*txPartition{}
	s.mu.Unlock()
	for _, tp := range parts {
		tp.mu.Lock()
		tp.drop()
		tp.mu.Unlock()
	}
	s.plain.Close()
}

func (s *TxSink) partition(p int) (*txPartition, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.New("idemq/franz: the TxSink is closed")
	}
	tp := s.parts[p]
	if tp == nil {
		tp = &txPartition{}
		s.parts[p] = tp
	}
	return tp, nil
}

// drop closes the partition's client: its next use starts a new one.
func (tp *txPartition) drop() {
	if tp.cl != nil {
		tp.cl.Close()
		tp.cl = nil
	}
	tp.known = false
}

// Watermark implements [relay.Watermarker]: it makes sure partition's
// producer runs under token (initialising a new producer id fences every
// earlier owner) and returns the partition's last committed watermark.
func (s *TxSink) Watermark(ctx context.Context, partition int, token int64) (relay.Watermark, error) {
	tp, err := s.partition(partition)
	if err != nil {
		return relay.Watermark{}, err
	}
	tp.mu.Lock()
	defer tp.mu.Unlock()
	if err := s.ensure(ctx, tp, partition, token); err != nil {
		return relay.Watermark{}, err
	}
	return tp.last, nil
}

// ensure gives tp a client under token with its last committed watermark
// read. tp.mu is held.
func (s *TxSink) ensure(ctx context.Context, tp *txPartition, p int, token int64) error {
	switch {
	case token < tp.token:
		return fmt.Errorf("%w: partition %d is owned under lease token %d, the messages carry %d", ErrFenced, p, tp.token, token)
	case tp.cl != nil && token == tp.token && tp.known:
		return nil
	}
	tp.drop()
	tp.token = token
	cl, err := kgo.NewClient(append(append([]kgo.Opt{}, s.opts...),
		kgo.TransactionalID(s.TransactionalID(p)),
		kgo.TransactionTimeout(s.cfg.TransactionTimeout),
	)...)
	if err != nil {
		return err
	}
	// InitProducerID: bumps the epoch, aborts what an earlier owner left
	// open and fences it.
	if _, _, err := cl.ProducerID(ctx); err != nil {
		cl.Close()
		return fmt.Errorf("idemq/franz: init the producer id of %s: %w", s.TransactionalID(p), err)
	}
	wm, err := s.readWatermark(ctx, cl, p)
	if err != nil {
		cl.Close()
		return err
	}
	tp.cl, tp.last, tp.known = cl, wm, true
	return nil
}

// Publish implements [relay.Sink]: one transaction per outbox key
// partition of batch, run concurrently; unkeyed messages through the
// plain idempotent producer. Messages that the partition's last committed
// watermark names were delivered already: they are reported delivered
// and not sent again.
func (s *TxSink) Publish(ctx context.Context, id relay.BatchID, batch []relay.Message) error {
	if len(batch) == 0 {
		return nil
	}
	f := relay.NewFailures(batch)
	recs := buildRecords(s.cfg.SinkConfig, batch, f)
	byPart := map[int][]int{}
	var unkeyed []int
	for i := range batch {
		if recs[i] == nil {
			continue
		}
		if p := batch[i].Partition; p >= 0 {
			byPart[p] = append(byPart[p], i)
		} else {
			unkeyed = append(unkeyed, i)
		}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for p, idx := range byPart {
		wg.Go(func() {
			failed := s.transact(ctx, id, batch, recs, p, idx)
			mu.Lock()
			for i, err := range failed {
				f.Fail(i, err)
			}
			mu.Unlock()
		})
	}
	unkeyedFailed := produce(ctx, s.plain, recs, unkeyed)
	wg.Wait()
	for i, err := range unkeyedFailed {
		f.Fail(i, err)
	}
	return f.Err(ctx)
}

// wmRecord is the value of a watermark record. Outbox is empty in the
// records of versions before it was written: those are taken as this
// TxSink's, so that an upgrade keeps the watermarks.
type wmRecord struct {
	Outbox    string  `json:"outbox,omitempty"`
	Partition int     `json:"partition"`
	Seq       int64   `json:"seq"`
	Token     int64   `json:"token"`
	Seqs      []int64 `json:"seqs"`
}

// transact publishes batch[i] for i in idx, all of outbox partition p, in
// one transaction of relay batch id, and returns the failed indexes: it
// begins the transaction, produces the records behind the watermark,
// and ends it, committing or aborting.
func (s *TxSink) transact(ctx context.Context, id relay.BatchID, batch []relay.Message, recs []*kgo.Record, p int, idx []int) map[int]error {
	tp, err := s.partition(p)
	if err != nil {
		return failAll(idx, err)
	}
	tp.mu.Lock()
	defer tp.mu.Unlock()
	t, err := s.begin(ctx, tp, id, batch, p, idx)
	if err != nil {
		return failAll(idx, err)
	}
	if len(t.send) == 0 {
		return t.failed
	}
	return s.end(ctx, t, s.produce(ctx, t, recs))
}

// txn is a transaction of one outbox partition's share of a batch.
type txn struct {
	tp     *txPartition
	p      int
	id     relay.BatchID
	token  int64         // the lease token the transaction runs under
	send   []int         // the batch indexes it produces
	wm     wmRecord      // its watermark
	failed map[int]error // the indexes that failed so far
}

func failAll(idx []int, err error) map[int]error {
	out := make(map[int]error, len(idx))
	for _, i := range idx {
		out[i] = err
	}
	return out
}

// begin makes sure tp's producer runs under the batch's lease token, sorts
// the messages into those to send, those fenced (an older token) and
// those the last committed watermark names (delivered already: reported
// delivered and named again, as their delete is still to come), and
// begins the transaction if there is anything to send. tp.mu is held.
func (s *TxSink) begin(ctx context.Context, tp *txPartition, id relay.BatchID, batch []relay.Message, p int, idx []int) (*txn, error) {
	token := batch[idx[0]].LeaseToken
	for _, i := range idx[1:] {
		token = max(token, batch[i].LeaseToken)
	}
	if err := s.ensure(ctx, tp, p, token); err != nil {
		return nil, err
	}
	t := &txn{tp: tp, p: p, id: id, token: token, failed: map[int]error{}, wm: wmRecord{Outbox: s.cfg.Outbox, Partition: p, Token: token}}
	delivered := make(map[int64]bool, len(tp.last.Seqs))
	for _, seq := range tp.last.Seqs {
		delivered[seq] = true
	}
	for _, i := range idx {
		m := &batch[i]
		switch {
		case m.LeaseToken < token:
			t.failed[i] = fmt.Errorf("%w: message %s carries lease token %d, the batch %d", ErrFenced, m.ID, m.LeaseToken, token)
			continue
		case m.Seq <= 0 || !delivered[m.Seq]:
			t.send = append(t.send, i)
		}
		t.wm.Seq = max(t.wm.Seq, m.Seq)
		t.wm.Seqs = append(t.wm.Seqs, m.Seq)
	}
	if len(t.send) == 0 {
		return t, nil
	}
	if err := tp.cl.BeginTransaction(); err != nil {
		tp.drop()
		return nil, fmt.Errorf("idemq/franz: begin a transaction of %s: %w", s.TransactionalID(p), err)
	}
	return t, nil
}

// watermark is t's watermark record. Another destination's share of the
// same relay batch (the last transaction of the partition, same batch
// and token) waits for the same delete: the watermark names its rows too.
func (s *TxSink) watermark(t *txn) *kgo.Record {
	if last := t.tp.last; t.id != 0 && t.id == t.tp.batch && last.Token == t.token {
		t.wm.Seq = max(t.wm.Seq, last.Seq)
		t.wm.Seqs = append(slices.Clip(last.Seqs), t.wm.Seqs...)
	}
	value, _ := json.Marshal(t.wm)
	return &kgo.Record{
		Topic:     s.cfg.WatermarkTopic,
		Partition: int32(t.p) % s.watermarkPartitions(),
		Key:       []byte(s.TransactionalID(t.p)),
		Value:     value,
	}
}

// produce sends the watermark and t's records in the open transaction,
// flushes them and runs the BeforeCommit crash point. It returns what
// must abort the transaction (a failed record, a done ctx, a failed
// flush), nil to commit; a failed record's error is also its own.
func (s *TxSink) produce(ctx context.Context, t *txn, recs []*kgo.Record) error {
	// The watermark goes first: its partition then joins the transaction
	// with the first records' partitions instead of in a round trip of
	// its own after them.
	rs := make([]*kgo.Record, 1, len(t.send)+1)
	rs[0] = s.watermark(t)
	for _, i := range t.send {
		rs = append(rs, recs[i])
	}
	errs := produceAll(ctx, t.tp.cl, rs, true)
	var cause error
	if err := errs[0]; err != nil {
		cause = fmt.Errorf("idemq/franz: watermark record: %w", err)
	}
	for j, i := range t.send {
		if err := errs[j+1]; err != nil {
			t.failed[i] = err
			cause = cmp.Or(cause, err)
		}
	}
	if cause == nil {
		cause = ctx.Err()
	}
	if cause == nil {
		// Flush before EndTransaction (produceAll flushed and every
		// promise came back, so this returns at once).
		cause = t.tp.cl.Flush(ctx)
	}
	if cause == nil {
		if hook := s.cfg.Test.BeforeCommit; hook != nil {
			cause = hook(ctx, t.p, t.token)
		}
	}
	return cause
}

// end aborts t for cause, or commits it when cause is nil, and returns
// the failed indexes. The commit's context is never cancelled: its
// outcome would be unknowable.
func (s *TxSink) end(ctx context.Context, t *txn, cause error) map[int]error {
	tp, p := t.tp, t.p
	if cause != nil {
		s.abort(tp, p)
		skipped := fmt.Errorf("%w: the transaction of partition %d aborted: %w", relay.ErrSkipped, p, cause)
		if fenced(cause) {
			skipped = fmt.Errorf("%w: %w", ErrFenced, cause)
		}
		for _, i := range t.send {
			if t.failed[i] == nil {
				t.failed[i] = skipped
			} else if fenced(t.failed[i]) {
				t.failed[i] = fmt.Errorf("%w: %w", ErrFenced, t.failed[i])
			}
		}
		return t.failed
	}
	endCtx := context.WithoutCancel(ctx)
	err := tp.cl.EndTransaction(endCtx, kgo.TryCommit)
	if err == nil {
		tp.last = relay.Watermark{Partition: p, Token: t.token, Seq: t.wm.Seq, Seqs: t.wm.Seqs}
		tp.batch = t.id
		return t.failed
	}
	// The commit was not attempted (the producer id had failed): abort.
	// Any other error: the outcome may be unknown; TryAbort is the
	// documented retry, and the client is replaced so that the next use
	// bumps the epoch and reads the watermark again.
	if abortErr := tp.cl.EndTransaction(endCtx, kgo.TryAbort); abortErr != nil || !errors.Is(err, kerr.OperationNotAttempted) {
		tp.drop()
	}
	err = fmt.Errorf("idemq/franz: commit the transaction of %s: %w", s.TransactionalID(p), err)
	if fenced(err) {
		err = fmt.Errorf("%w: %w", ErrFenced, err)
	}
	for _, i := range t.send {
		t.failed[i] = err
	}
	return t.failed
}

// abort ends the open transaction with TryAbort after dropping what is
// buffered. A producer that is fenced or failed otherwise is dropped; one
// whose abort succeeded, or failed with an error franz-go documents as
// recoverable (TransactionAbortable; before KIP-890 part 2
// InvalidProducerIDMapping and InvalidProducerEpoch; UnknownProducerID)
// is kept.
func (s *TxSink) abort(tp *txPartition, p int) {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.TransactionTimeout)
	defer cancel()
	if err := tp.cl.AbortBufferedRecords(ctx); err != nil {
		tp.drop()
		return
	}
	err := tp.cl.EndTransaction(context.Background(), kgo.TryAbort)
	switch {
	case err == nil:
	case errors.Is(err, kerr.TransactionAbortable), errors.Is(err, kerr.UnknownProducerID):
		// recoverable after the abort; the next BeginTransaction recovers.
	default:
		tp.drop()
	}
}

// fenced reports whether err says a newer producer owns the
// transactional id.
func fenced(err error) bool {
	return errors.Is(err, ErrFenced) || errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) ||
		errors.Is(err, kerr.InvalidProducerIDMapping)
}

// watermarkPartitions returns the partition count of WatermarkTopic,
// known once a watermark was read.
func (s *TxSink) watermarkPartitions() int32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return max(s.wmParts, 1)
}

// readWatermark returns the last committed watermark record of outbox
// partition p, reading WatermarkTopic's partition for p up to its last
// stable offset, the newest records first.
func (s *TxSink) readWatermark(ctx context.Context, cl *kgo.Client, p int) (relay.Watermark, error) {
	n, err := s.watermarkTopic(ctx, cl)
	if err != nil {
		return relay.Watermark{}, err
	}
	wp := int32(p) % n
	// Everything p committed lies below the high watermark read after the
	// InitProducerID; once the last stable offset reached it, every
	// transaction there has ended. With a partition to itself (the
	// watermark topic has 64 or more) p has none open and the wait is
	// nil; a partition shared with another outbox partition may wait for
	// that one's open transaction.
	hwm, err := s.listOffset(ctx, cl, wp, false)
	if err != nil {
		return relay.Watermark{}, err
	}
	end := int64(0)
	for {
		if end, err = s.listOffset(ctx, cl, wp, true); err != nil || end >= hwm {
			break
		}
		if err = lifecycle.Sleep(ctx, 20*time.Millisecond); err != nil {
			break
		}
	}
	if err != nil || end == 0 {
		return relay.Watermark{Partition: p}, err
	}
	key := s.TransactionalID(p)
	for back := int64(8); ; back *= 16 {
		start := max(end-back, 0)
		v, found, err := s.scanWatermark(ctx, wp, start, end, key)
		switch {
		case err != nil:
			return relay.Watermark{}, err
		case !found && start > 0:
			continue
		case !found:
			return relay.Watermark{Partition: p}, nil
		case v.Outbox != "" && v.Outbox != s.cfg.Outbox:
			return relay.Watermark{}, fmt.Errorf("idemq/franz: the watermark of %s on %s belongs to another outbox (%s; this TxSink's is %s): "+
				"give each outbox its own TransactionalIDPrefix and WatermarkTopic, or leave them empty for names derived from the outbox",
				key, s.cfg.WatermarkTopic, v.Outbox, s.cfg.Outbox)
		case v.Partition != p:
			return relay.Watermark{}, fmt.Errorf("idemq/franz: the watermark of %s names partition %d", key, v.Partition)
		}
		return relay.Watermark{Partition: p, Token: v.Token, Seq: v.Seq, Seqs: v.Seqs}, nil
	}
}

// scanWatermark reads partition wp of WatermarkTopic from start to end
// (read_committed, control records kept so the end is seen) and returns
// the last watermark record with key.
func (s *TxSink) scanWatermark(ctx context.Context, wp int32, start, end int64, key string) (wmRecord, bool, error) {
	rd, err := kgo.NewClient(append(append([]kgo.Opt{}, s.opts...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{s.cfg.WatermarkTopic: {wp: kgo.NewOffset().At(start)}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
		kgo.FetchMaxWait(100*time.Millisecond),
	)...)
	if err != nil {
		return wmRecord{}, false, err
	}
	defer rd.Close()
	var wm wmRecord
	found := false
	for {
		fs := rd.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return wm, false, err
		}
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) { ferr = cmp.Or(ferr, err) })
		if ferr != nil {
			return wm, false, fmt.Errorf("idemq/franz: read the watermark topic: %w", ferr)
		}
		done := false
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset >= end-1 {
				done = true
			}
			if r.Offset >= end || r.Attrs.IsControl() || string(r.Key) != key {
				return
			}
			var v wmRecord
			if json.Unmarshal(r.Value, &v) == nil {
				wm, found = v, true
			}
		})
		if done {
			return wm, found, nil
		}
	}
}

// listOffset returns the high watermark (stable false) or the last
// stable offset (stable true) of partition wp of WatermarkTopic.
func (s *TxSink) listOffset(ctx context.Context, cl *kgo.Client, wp int32, stable bool) (int64, error) {
	list := kadm.NewClient(cl).ListEndOffsets
	if stable {
		list = kadm.NewClient(cl).ListCommittedOffsets
	}
	offsets, err := list(ctx, s.cfg.WatermarkTopic)
	o, ok := offsets.Lookup(s.cfg.WatermarkTopic, wp)
	switch {
	case err != nil:
	case !ok:
		err = fmt.Errorf("partition %d missing from the answer", wp)
	default:
		err = o.Err
	}
	if err != nil {
		return 0, fmt.Errorf("idemq/franz: list the watermark topic's offsets: %w", err)
	}
	return o.Offset, nil
}

// watermarkTopic returns the partition count of WatermarkTopic, creating
// the topic (compacted, WatermarkPartitionsDefault partitions) if it does
// not exist.
func (s *TxSink) watermarkTopic(ctx context.Context, cl *kgo.Client) (int32, error) {
	s.mu.Lock()
	n := s.wmParts
	s.mu.Unlock()
	if n > 0 {
		return n, nil
	}
	adm := kadm.NewClient(cl)
	for attempt := 0; ; attempt++ {
		topics, err := adm.ListTopics(ctx, s.cfg.WatermarkTopic)
		if err != nil {
			return 0, fmt.Errorf("idemq/franz: watermark topic metadata: %w", err)
		}
		if t, ok := topics[s.cfg.WatermarkTopic]; ok && t.Err == nil && len(t.Partitions) > 0 {
			n = int32(len(t.Partitions))
			s.mu.Lock()
			s.wmParts = n
			s.mu.Unlock()
			return n, nil
		}
		if attempt > 0 {
			if err := lifecycle.Sleep(ctx, 100*time.Millisecond); err != nil || attempt > 50 {
				return 0, fmt.Errorf("idemq/franz: the watermark topic %s did not appear: %w", s.cfg.WatermarkTopic, cmp.Or[error](err, kerr.UnknownTopicOrPartition))
			}
			continue
		}
		_, err = adm.CreateTopic(ctx, WatermarkPartitionsDefault, -1, map[string]*string{"cleanup.policy": kmsg.StringPtr("compact")}, s.cfg.WatermarkTopic)
		if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			return 0, fmt.Errorf("idemq/franz: create the watermark topic %s: %w", s.cfg.WatermarkTopic, err)
		}
	}
}

// WatermarkTopic returns the topic of the watermark records.
func (s *TxSink) WatermarkTopic() string { return s.cfg.WatermarkTopic }
