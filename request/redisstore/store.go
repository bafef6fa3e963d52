// Package redisstore keeps request records in Redis (go-redis v9): the
// fast store of package request, with weaker promises than Postgres.
//
// # Layout
//
// A key has two Redis keys under one hash tag, so that one Redis Cluster
// slot holds both and a Lua script may touch them together:
//
//	<prefix>:{<len(scope)>:<scope>:<key>}:r  a hash: fingerprint, state, token, response; PEXPIRE record TTL
//	<prefix>:{<len(scope)>:<scope>:<key>}:l  the lease: SET NX PX, its value the token
//
// Every operation is one script (EVALSHA), so it is atomic and one round
// trip; a request that completes sends two commands (claim, complete),
// plus one per lease extension. Concurrent requests share round trips:
// their scripts go through the client's autopipeliner (see
// [Config.NoAutoPipeline]). A claim takes the lease with SET NX PX; Complete, Release and
// Extend check the record's state and fencing token before they write.
// The token is max(previous + 1, the server's clock in microseconds), so
// it grows even across a record that expired and was created again,
// without a counter key that would never expire.
//
// # What Redis cannot promise
//
//   - Replication is asynchronous. A primary that fails over can lose a
//     claim or a stored response that it acknowledged: a retry then runs
//     the request again. WAIT after each write narrows the window but does
//     not close it. Where running twice is not acceptable, use the
//     Postgres store.
//   - Eviction. A server with maxmemory set and a policy other than
//     noeviction may drop records under memory pressure; volatile-*
//     policies are no safer, since every record has a TTL. [New] checks
//     the policy and refuses such a server unless
//     [Config.SkipEvictionCheck] is set (for managed servers that hide
//     CONFIG).
//   - Persistence. Without AOF (appendfsync everysec or always), a restart
//     forgets records.
//
// Lease times come from the Redis server's clock (TIME), so clients'
// clocks do not matter.
package redisstore

import (
	"cmp"
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/nilcheck"
	"github.com/idemq/idemq/request"
)

// Config configures a Store. The zero value is valid.
type Config struct {
	// Prefix starts every Redis key of the store; it must not contain
	// braces, which would break the hash tag. Defaults to "idemq:req".
	Prefix string
	// RecordTTL is how long a record is kept after its last change.
	// Defaults to request.RecordTTLDefault (24 hours).
	RecordTTL time.Duration
	// SkipEvictionCheck skips the check of maxmemory-policy in New, for
	// servers whose CONFIG command is disabled. Make sure the server
	// never evicts. Defaults to false.
	SkipEvictionCheck bool
	// NoAutoPipeline makes every call take a connection of its own. By
	// default the store sends its scripts through the client's blocking
	// autopipeliner (go-redis AutoPipeline, on a *redis.Client,
	// *redis.ClusterClient or *redis.Ring), which writes the commands of
	// concurrent requests to Redis together: one write and one read for
	// many requests instead of one each, in each request's own order. The
	// autopipeliner is the client's own (shared with everything else that
	// asks the client for it) and closes with the client. Defaults to
	// false.
	NoAutoPipeline bool
}

// PrefixDefault is the default Config.Prefix.
const PrefixDefault = "idemq:req"

const component = "redisstore"

func (c Config) withDefaults() Config {
	c.Prefix = cmp.Or(c.Prefix, PrefixDefault)
	c.RecordTTL = cmp.Or(c.RecordTTL, request.RecordTTLDefault)
	return c
}

func (c Config) validate() error {
	switch {
	case strings.ContainsAny(c.Prefix, "{}"):
		return idemq.NewConfigError(component, "Prefix", "%q contains a brace, which would break the hash tag", c.Prefix)
	case c.RecordTTL < time.Millisecond:
		return idemq.NewConfigError(component, "RecordTTL", "%v is below a millisecond", c.RecordTTL)
	}
	return nil
}

// Store is a [request.Store] on Redis. It is safe for concurrent use.
type Store struct {
	rdb redis.UniversalClient
	// run sends the scripts: the client's autopipeliner, or rdb.
	run redis.Scripter
	cfg Config
}

// autoPipeliner is what the clients with an autopipeliner have.
type autoPipeliner interface {
	AutoPipeline() (*redis.AutoPipeliner, error)
}

var _ request.Store = (*Store)(nil)

// New returns a Store on rdb (a *redis.Client, *redis.ClusterClient or a
// failover client). Unless cfg.SkipEvictionCheck, it asks the server for
// its maxmemory and maxmemory-policy and refuses one that may evict
// records.
func New(ctx context.Context, rdb redis.UniversalClient, cfg Config) (*Store, error) {
	if nilcheck.IsNil(rdb) {
		return nil, idemq.NewConfigError(component, "rdb", "is nil (%T); pass a *redis.Client, *redis.ClusterClient or failover client", rdb)
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Store{rdb: rdb, run: rdb, cfg: cfg}
	if ap, ok := rdb.(autoPipeliner); ok && !cfg.NoAutoPipeline {
		p, err := ap.AutoPipeline()
		if err != nil {
			return nil, fmt.Errorf("redisstore: autopipeliner (set Config.NoAutoPipeline to do without): %w", err)
		}
		s.run = p
	}
	if !cfg.SkipEvictionCheck {
		if err := s.checkEviction(ctx); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func (s *Store) checkEviction(ctx context.Context) error {
	conf, err := s.rdb.ConfigGet(ctx, "maxmemory*").Result()
	if err != nil {
		return fmt.Errorf("redisstore: read maxmemory-policy (set Config.SkipEvictionCheck if CONFIG is disabled and the server never evicts): %w", err)
	}
	if conf["maxmemory"] == "0" || conf["maxmemory-policy"] == "noeviction" {
		return nil
	}
	return idemq.NewConfigError(component, "rdb",
		"the server has maxmemory %s and maxmemory-policy %q, so it may evict request records (volatile-* policies too: every record has a TTL); set maxmemory-policy noeviction",
		conf["maxmemory"], conf["maxmemory-policy"])
}

// RecordTTL returns Config.RecordTTL.
func (s *Store) RecordTTL() time.Duration { return s.cfg.RecordTTL }

// keys returns the record and lease keys of id under one hash tag. The
// scope's length makes the tag unambiguous; a brace inside scope or key
// ends the tag early, but at the same place in both keys.
func (s *Store) keys(id request.ID) []string {
	base := s.cfg.Prefix + ":{" + strconv.Itoa(len(id.Scope)) + ":" + id.Scope + ":" + id.Key + "}:"
	return []string{base + "r", base + "l"}
}

//go:embed store.lua
var storeLua string

var script = redis.NewScript(storeLua)

// The replies of the script: a kind, then its values.
const (
	replyAcquired = "acquired"
	replyRecord   = "record"
	replyMissing  = "missing"
	replyOK       = "ok"
)

// Claim implements [request.Store.Claim].
func (s *Store) Claim(ctx context.Context, id request.ID, fingerprint []byte, lease time.Duration) (request.Claim, error) {
	if err := checkID(id); err != nil {
		return request.Claim{}, err
	}
	reply, err := script.Run(ctx, s.run, s.keys(id), "claim", fingerprint, lease.Milliseconds(), s.cfg.RecordTTL.Milliseconds()).Slice()
	if err != nil {
		return request.Claim{}, fmt.Errorf("redisstore: claim %q: %w", id.Key, err)
	}
	if len(reply) == 3 && reply[0] == replyAcquired {
		return request.Claim{Acquired: true, Lease: idemq.Lease{Scope: id.Scope, Key: id.Key, Token: toInt(reply[1]), Until: time.UnixMilli(toInt(reply[2]))}}, nil
	}
	rec, err := parseRecord(id, reply)
	if err != nil {
		return request.Claim{}, err
	}
	if string(rec.Fingerprint) != string(fingerprint) {
		return request.Claim{}, &request.ConflictError{ID: id, Fingerprint: fingerprint, Stored: rec}
	}
	return request.Claim{Record: rec}, nil
}

// checkID refuses what cannot be stored; the Guard checks keys first, so
// this only guards direct callers.
func checkID(id request.ID) error {
	if id.Key == "" {
		return fmt.Errorf("%w: empty", request.ErrInvalidKey)
	}
	return nil
}

// Complete implements [request.Store.Complete].
func (s *Store) Complete(ctx context.Context, lease idemq.Lease, resp request.Response) error {
	body, err := resp.MarshalBinary()
	if err != nil {
		return err
	}
	_, err = s.finish(ctx, "complete", lease, s.cfg.RecordTTL, body)
	return err
}

// Release implements [request.Store.Release].
func (s *Store) Release(ctx context.Context, lease idemq.Lease) error {
	_, err := s.finish(ctx, "release", lease, s.cfg.RecordTTL, nil)
	return err
}

// Extend implements [request.Store.Extend].
func (s *Store) Extend(ctx context.Context, lease idemq.Lease, d time.Duration) (idemq.Lease, error) {
	until, err := s.finish(ctx, "extend", lease, d, nil)
	if err == nil {
		lease.Until = time.UnixMilli(until)
	}
	return lease, err
}

// finish runs complete, release or extend: d is the record TTL or the
// lease. It returns the lease's new end for extend.
func (s *Store) finish(ctx context.Context, op string, lease idemq.Lease, d time.Duration, body []byte) (int64, error) {
	args := []any{op, lease.Token, d.Milliseconds()}
	if body != nil {
		args = append(args, body)
	}
	reply, err := script.Run(ctx, s.run, s.keys(request.ID{Scope: lease.Scope, Key: lease.Key}), args...).Slice()
	if err != nil {
		return 0, fmt.Errorf("redisstore: %s %q: %w", op, lease.Key, err)
	}
	if len(reply) != 2 || reply[0] != replyOK {
		return 0, idemq.ErrLeaseLost
	}
	return toInt(reply[1]), nil
}

// Get implements [request.Store.Get].
func (s *Store) Get(ctx context.Context, id request.ID) (request.Record, error) {
	reply, err := script.Run(ctx, s.run, s.keys(id), "get").Slice()
	if err != nil {
		return request.Record{}, fmt.Errorf("redisstore: get %q: %w", id.Key, err)
	}
	return parseRecord(id, reply)
}

// parseRecord reads the reply {"record", fingerprint, state, token,
// lease until ms, expires at ms, response} or {"missing"}.
func parseRecord(id request.ID, reply []any) (request.Record, error) {
	if len(reply) == 1 && reply[0] == replyMissing {
		return request.Record{}, request.ErrNotFound
	}
	if len(reply) != 7 || reply[0] != replyRecord {
		return request.Record{}, fmt.Errorf("redisstore: unexpected reply %v", reply)
	}
	rec := request.Record{
		ID:          id,
		Fingerprint: []byte(toString(reply[1])),
		State:       request.State(toInt(reply[2])),
		Token:       toInt(reply[3]),
		ExpiresAt:   time.UnixMilli(toInt(reply[5])),
	}
	switch rec.State {
	case request.InProgress:
		rec.LeaseUntil = time.UnixMilli(toInt(reply[4]))
	case request.Completed:
		rec.Response = &request.Response{}
		if err := rec.Response.UnmarshalBinary([]byte(toString(reply[6]))); err != nil {
			return rec, fmt.Errorf("redisstore: record %q: %w", id.Key, err)
		}
	case request.Released:
	default:
		return rec, fmt.Errorf("redisstore: record %q has state %d", id.Key, rec.State)
	}
	return rec, nil
}

func toInt(v any) int64 {
	switch v := v.(type) {
	case int64:
		return v
	case string:
		n, _ := strconv.ParseInt(v, 10, 64)
		return n
	}
	return 0
}

func toString(v any) string {
	s, _ := v.(string)
	return s
}
