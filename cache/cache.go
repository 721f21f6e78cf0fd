// Package cache is the Redis side of onceonly: a cache of the idempotency
// keys' Postgres state, written only through the Lua scripts in lua/
// (scripts.go), each touching one key. A check answers a completed key from one
// plain read; anything else it decides in one script.
//
// The cache may be lost at any moment. It answers replays, conflicts and
// reused keys quickly; Postgres decides everything it cannot.
package cache

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceonly/onceonly/keystate"
)

// DefaultMaxBody is the largest response body the cache keeps (8 KiB);
// larger bodies stay in Postgres and the cache keeps a marker.
const DefaultMaxBody = 8 << 10

// Verdict is what the check script decided.
type Verdict int

// The verdicts of Check.
const (
	// Claimed: the caller holds a provisional claim and goes on to Postgres.
	Claimed Verdict = iota
	// Replay: the key completed with this fingerprint; Entry holds the response.
	Replay
	// InFlight: another request holds the key; retry after RetryAfter.
	InFlight
	// Mismatch: the key belongs to another fingerprint.
	Mismatch
	// Undecided (Peek only): Redis cannot answer; Postgres decides.
	Undecided
)

// String returns the verdict's name, for logs and metrics.
func (v Verdict) String() string {
	switch v {
	case Claimed:
		return "claimed"
	case Replay:
		return "replay"
	case InFlight:
		return "in_flight"
	case Mismatch:
		return "mismatch"
	case Undecided:
		return "undecided"
	}
	return fmt.Sprintf("verdict(%d)", int(v))
}

// CheckResult is the answer of Check.
type CheckResult struct {
	Verdict Verdict
	// Entry is the completed entry for Replay.
	Entry Entry
	// RetryAfter is the remaining lease for InFlight.
	RetryAfter time.Duration
}

// Cache reads and writes idempotency state in Redis.
type Cache struct {
	rdb     redis.UniversalClient
	prefix  string
	maxBody int
	check   *redis.Script
	apply   *redis.Script
	release *redis.Script
	// compressMin: bodies this long or longer are stored deflated when
	// that pays (0: never).
	compressMin int
	// layout1: completed values are written in layout 1.
	layout1 bool
	// readFirst: Check reads the value before the script (false where a
	// read may be answered by a replica).
	readFirst bool
	// pipe sends the commands of concurrent checks, applies and releases
	// together (nil: each on its own).
	pipe *pipeline
}

// Options configures a Cache.
type Options struct {
	// Prefix of every key; DefaultPrefix when empty.
	Prefix string
	// MaxBody is the largest body kept in Redis; DefaultMaxBody when zero.
	MaxBody int
	// CompressMin, when positive, is the smallest body stored deflated
	// (when that saves an eighth of it); zero or negative: never, the
	// default, as every replay of a deflated body inflates it (about 10 µs
	// for 2 KiB). DefaultCompressMin is the size the benchmarks use.
	// Values of either kind are read whatever it is.
	CompressMin int
	// NoAutoPipeline sends every check, apply and release on its own
	// round trip. By default, commands that callers send while others are
	// on the wire go together in the next pipeline (one write, one read),
	// which costs a lone caller nothing and saves the client and Redis a
	// system call pair per command under load. A cluster client always
	// sends each on its own: a pipeline waits for every node it touches,
	// so one slow node would hold up the commands for all the others.
	NoAutoPipeline bool
	// WriteLayout1 writes completed values in layout 1, which releases
	// before layout 2 (2026-11-24) read and wrote: they take a layout-2
	// value for another payload's and answer a replay 422. Set it on every
	// process (api, relay, reconciler) for a rolling upgrade from such a
	// release, and unset it once none of them runs. Values of either layout
	// are read whatever it is; CompressMin does not apply to layout 1.
	WriteLayout1 bool
}

// New returns a Cache over the client.
func New(rdb redis.UniversalClient, opts Options) *Cache {
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	if opts.MaxBody == 0 {
		opts.MaxBody = DefaultMaxBody
	}
	opts.CompressMin = max(opts.CompressMin, 0)
	var pipe *pipeline
	if _, cluster := rdb.(*redis.ClusterClient); !cluster && !opts.NoAutoPipeline {
		pipe = &pipeline{rdb: rdb}
	}
	return &Cache{
		pipe:        pipe,
		rdb:         rdb,
		prefix:      opts.Prefix,
		maxBody:     opts.MaxBody,
		check:       redis.NewScript(checkScript),
		apply:       redis.NewScript(applyScript),
		release:     redis.NewScript(releaseScript),
		readFirst:   !readsReplicas(rdb),
		compressMin: opts.CompressMin,
		layout1:     opts.WriteLayout1,
	}
}

// Prefix returns the key prefix.
func (c *Cache) Prefix() string { return c.prefix }

// Client returns the Redis client.
func (c *Cache) Client() redis.UniversalClient { return c.rdb }

// Key returns the Redis key of ref.
func (c *Cache) Key(ref keystate.Ref) string { return KeyName(c.prefix, ref) }

// Load loads every script into Redis, so pipelines of EVALSHA do not meet
// NOSCRIPT.
func (c *Cache) Load(ctx context.Context) error {
	for _, s := range []*redis.Script{c.check, c.apply, c.release} {
		if err := s.Load(ctx, c.rdb).Err(); err != nil {
			return fmt.Errorf("load script: %w", err)
		}
	}
	return nil
}

// Check answers a request from the cache, or records a provisional claim
// for owner that lasts lease.
//
// A replay costs what a bare GET does: the value is read first and, when it
// is completed, answered (Replay, or Mismatch for another fingerprint) in
// Go without a script, which would answer the same and write nothing. A key
// absent, failed, in progress or not in the layout goes on to the check
// script, which decides with Redis TIME and claims atomically, as it did
// before the read: a first execution pays one more round trip.
func (c *Cache) Check(ctx context.Context, ref keystate.Ref, fingerprint string, owner keystate.Owner, lease time.Duration) (CheckResult, error) {
	key := c.Key(ref)
	digest := digestOf(fingerprint)
	if c.readFirst {
		// GETRANGE 0 -1 reads the whole value as GET does, but answers an
		// absent key with "" (no value is empty) rather than a nil reply,
		// which go-redis turns into an error it classifies at some cost.
		cmd := redis.NewStringCmd(ctx, "getrange", key, rangeStart, rangeEnd)
		c.do(ctx, cmd)
		raw, err := cmd.Bytes()
		switch {
		case err == nil:
			if res, ok := answerCompleted(raw, &digest); ok {
				return res, nil
			}
		case Unavailable(err):
			return CheckResult{}, fmt.Errorf("check key: %w", err)
		}
		// Anything else (WRONGTYPE: not a string) is the script's to judge.
	}
	return c.checkScript(ctx, key, digest, owner, lease)
}

// rangeStart and rangeEnd are GETRANGE's arguments for a whole value, boxed
// once.
var rangeStart, rangeEnd any = 0, -1

// checkScript runs the check script (its own function so that only this
// path pays for the arguments escaping to the heap).
func (c *Cache) checkScript(ctx context.Context, key string, digest [digestLen]byte, owner keystate.Owner, lease time.Duration) (CheckResult, error) {
	reply, err := c.run(ctx, c.check, key, digest[:], owner[:], lease.Milliseconds()).Slice()
	if err != nil {
		return CheckResult{}, fmt.Errorf("check key: %w", err)
	}
	return interpretCheck(reply)
}

// interpretCheck maps the check script's reply to a CheckResult.
func interpretCheck(reply []any) (CheckResult, error) {
	if len(reply) == 0 {
		return CheckResult{}, errors.New("check key: empty reply")
	}
	code, _ := reply[0].(int64)
	switch Verdict(code) {
	case Claimed:
		return CheckResult{Verdict: Claimed}, nil
	case Replay:
		raw, _ := reply[1].(string)
		entry, err := Decode([]byte(raw))
		if err != nil {
			// The script decoded it; a Go failure here means the layouts
			// disagree. Treat it as a miss that Postgres resolves.
			return CheckResult{Verdict: Claimed}, fmt.Errorf("check key: decode replay: %w", err)
		}
		return CheckResult{Verdict: Replay, Entry: entry}, nil
	case InFlight:
		ms, _ := reply[1].(int64)
		return CheckResult{Verdict: InFlight, RetryAfter: time.Duration(ms) * time.Millisecond}, nil
	case Mismatch:
		return CheckResult{Verdict: Mismatch}, nil
	case Undecided: // Peek's alone: the script never answers it
	}
	return CheckResult{}, fmt.Errorf("check key: unexpected reply %v", reply)
}

// answerCompleted answers a request for digest from raw, the value just
// read, when raw is a completed value: exactly what check.lua answers for
// it. ok is false for anything else, which the script must see.
func answerCompleted(raw []byte, digest *[digestLen]byte) (CheckResult, bool) {
	p, ok := parsePrefix(raw)
	if !ok || p.state != keystate.Completed {
		return CheckResult{}, false
	}
	if string(p.digest) != string(digest[:shortDigestLen]) {
		return CheckResult{Verdict: Mismatch}, true
	}
	entry, err := decodeRest(p, raw)
	if err != nil {
		return CheckResult{}, false // the script answers, as before
	}
	return CheckResult{Verdict: Replay, Entry: entry}, true
}

// do runs cmd, in a pipeline with the commands of concurrent callers unless
// the cache sends each on its own; the reply or error is in cmd.
func (c *Cache) do(ctx context.Context, cmd redis.Cmder) {
	if c.pipe == nil {
		_ = c.rdb.Process(ctx, cmd) // the error is in the command
		return
	}
	c.pipe.do(ctx, cmd)
}

// run runs script on key with args as script.Run does: EVALSHA, and EVAL
// when Redis does not have the script (restarted, or a new node).
func (c *Cache) run(ctx context.Context, script *redis.Script, key string, args ...any) *redis.Cmd {
	cmd := redis.NewCmd(ctx, append([]any{"evalsha", script.Hash(), 1, key}, args...)...)
	c.do(ctx, cmd)
	if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		return script.Eval(ctx, c.rdb, []string{key}, args...)
	}
	return cmd
}

// readsReplicas reports whether rdb may send a read-only command (GETRANGE)
// to a replica, which could still hold a value its master deleted.
func readsReplicas(rdb redis.UniversalClient) bool {
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		o := cc.Options()
		return o.ReadOnly || o.RouteByLatency || o.RouteRandomly
	}
	return false
}

// args returns the apply script's ARGV that writes k, a Postgres state,
// with the compare-and-set expectation expect ("" for a plain versioned
// apply). A key that is gone (ExpiresIn ≤ 0) is deleted.
func (c *Cache) args(k keystate.Key, expect string) ([]any, error) {
	ttl := k.ExpiresIn.Milliseconds()
	if ttl < 1 {
		return []any{k.Version, "", 0, "", "", expect}, nil
	}
	digest := digestOf(k.Fingerprint)
	switch k.Status {
	case keystate.InProgress:
		lease := max(k.LeaseRemaining.Milliseconds(), 0)
		return []any{k.Version, head(keystate.InProgress, k.Version, flagConfirmed, &digest), ttl, lease, k.Owner[:], expect}, nil
	case keystate.Completed:
		large := k.BodyOmitted || len(k.Response.Body) > c.maxBody
		if c.layout1 {
			return []any{k.Version, encodeLayout1(k.Version, &digest, k.Response, large), ttl, "", "", expect}, nil
		}
		value, err := encodeCompleted(k.Version, &digest, k.Response, large, c.compressMin)
		if err != nil {
			return nil, fmt.Errorf("apply %s:%s: %w", k.Scope, k.Key, err)
		}
		return []any{k.Version, value, ttl, "", "", expect}, nil
	case keystate.Failed:
		return []any{k.Version, head(keystate.Failed, k.Version, flagConfirmed, &digest), ttl, "", "", expect}, nil
	}
	return nil, fmt.Errorf("apply %s:%s: unknown state %q", k.Scope, k.Key, k.Status)
}

// Apply writes k, a Postgres state, unless the cache holds its version or a
// newer one (a key that is gone is deleted); it reports whether it wrote.
func (c *Cache) Apply(ctx context.Context, k keystate.Key) (bool, error) {
	args, err := c.args(k, "")
	if err != nil {
		return false, err
	}
	n, err := c.run(ctx, c.apply, c.Key(k.Ref), args...).Int()
	if err != nil {
		return false, fmt.Errorf("apply %s:%s: %w", k.Scope, k.Key, err)
	}
	return n == 1, nil
}

// ApplyResult is the outcome of one update of ApplyBatch.
type ApplyResult struct {
	Applied bool
	Err     error
}

// ApplyBatch applies every key as Apply does, in one pipeline of EVALSHA
// calls; a cluster client splits the pipeline per node. The returned error
// covers the batch as a whole (no call reached Redis); per-key failures are
// in the results, those for want of Redis wrapping ErrUnavailable.
func (c *Cache) ApplyBatch(ctx context.Context, keys []keystate.Key) ([]ApplyResult, error) {
	return c.applyNamed(ctx, len(keys), func(i int) (string, []any, error) {
		args, err := c.args(keys[i], "")
		return c.Key(keys[i].Ref), args, err
	})
}

// RepairBatch is the reconciler's compare-and-set form of ApplyBatch: key i
// is written only if the value held still starts with expect[i] (a
// Header's Expect: what the reconciler saw) or, for ExpectAbsent, only if
// there is no value; versions are not compared. A provisional claim under a
// live lease (a request in flight) is never overwritten this way.
func (c *Cache) RepairBatch(ctx context.Context, keys []keystate.Key, expect []string) ([]ApplyResult, error) {
	return c.applyNamed(ctx, len(keys), func(i int) (string, []any, error) {
		args, err := c.args(keys[i], expect[i])
		return c.Key(keys[i].Ref), args, err
	})
}

// applyNamed runs n apply calls in one pipeline; call i gets its key name
// and ARGV from argsOf. The calls are EVALSHA without loading the script
// first: a server that lost its scripts (restarted, or new in the cluster)
// answers NOSCRIPT, and only those calls go again once the script is loaded.
func (c *Cache) applyNamed(ctx context.Context, n int, argsOf func(i int) (string, []any, error)) ([]ApplyResult, error) {
	results := make([]ApplyResult, n)
	names := make([]string, n)
	argv := make([][]any, n)
	sent := make([]int, 0, n)
	for i := range n {
		var err error
		names[i], argv[i], err = argsOf(i)
		if err != nil {
			results[i].Err = err
			continue
		}
		sent = append(sent, i)
	}
	noScript, err := c.evalApply(ctx, sent, names, argv, results)
	if len(noScript) > 0 {
		// A node that is down fails the load; its calls fail again below.
		if lerr := c.apply.Load(ctx, c.rdb).Err(); lerr != nil && !Unavailable(lerr) {
			return nil, fmt.Errorf("apply batch: load script: %w", lerr)
		}
		_, err = c.evalApply(ctx, noScript, names, argv, results)
	}
	if err != nil && allUnavailable(results, sent) {
		return nil, fmt.Errorf("apply batch: %w: %w", ErrUnavailable, err)
	}
	return results, nil
}

// evalApply sends the apply calls idx in one pipeline and records their
// results; it returns the calls answered NOSCRIPT, and the pipeline's
// first error.
func (c *Cache) evalApply(ctx context.Context, idx []int, names []string, argv [][]any, results []ApplyResult) (noScript []int, err error) {
	if len(idx) == 0 {
		return nil, nil
	}
	cmds := make([]*redis.Cmd, len(idx))
	_, err = c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for j, i := range idx {
			cmds[j] = c.apply.EvalSha(ctx, p, []string{names[i]}, argv[i]...)
		}
		return nil
	})
	for j, i := range idx {
		applied, cerr := cmds[j].Int()
		switch {
		case cerr == nil:
			results[i] = ApplyResult{Applied: applied == 1}
			continue
		case redis.HasErrorPrefix(cerr, "NOSCRIPT"):
			noScript = append(noScript, i)
		}
		if Unavailable(cerr) {
			// A cluster node that is down fails only the keys it holds.
			results[i].Err = fmt.Errorf("apply %s: %w: %w", names[i], ErrUnavailable, cerr)
		} else {
			results[i].Err = fmt.Errorf("apply %s: %w", names[i], cerr)
		}
	}
	if err != nil {
		return noScript, fmt.Errorf("apply pipeline: %w", err)
	}
	return noScript, nil
}

// allUnavailable reports whether every sent call failed for want of Redis:
// the batch as a whole did not reach it.
func allUnavailable(results []ApplyResult, sent []int) bool {
	for _, i := range sent {
		if !errors.Is(results[i].Err, ErrUnavailable) {
			return false
		}
	}
	return true
}

// Release drops owner's provisional claim on ref; it reports whether there
// was one.
func (c *Cache) Release(ctx context.Context, ref keystate.Ref, owner keystate.Owner) (bool, error) {
	n, err := c.run(ctx, c.release, c.Key(ref), owner[:]).Int()
	if err != nil {
		return false, fmt.Errorf("release key: %w", err)
	}
	return n == 1, nil
}

// Read returns the decoded entry of ref. found is false for a missing key;
// a value that does not decode returns ErrCorrupt.
func (c *Cache) Read(ctx context.Context, ref keystate.Ref) (entry Entry, found bool, err error) {
	raw, err := c.rdb.Get(ctx, c.Key(ref)).Bytes()
	if errors.Is(err, redis.Nil) {
		return Entry{}, false, nil
	}
	if err != nil {
		return Entry{}, false, fmt.Errorf("read key: %w", err)
	}
	entry, err = Decode(raw)
	return entry, true, err
}

// Peek judges a request for ref with fingerprint as Check does, from one
// read and without claiming anything: Replay for a key completed with
// fingerprint, Mismatch for a settled key of another fingerprint (a key in
// progress may be gone: Postgres judges it), Undecided otherwise. A value
// that does not decode returns ErrCorrupt.
func (c *Cache) Peek(ctx context.Context, ref keystate.Ref, fingerprint string) (CheckResult, error) {
	entry, found, err := c.Read(ctx, ref)
	if err != nil {
		return CheckResult{}, err
	}
	if !found {
		return CheckResult{Verdict: Undecided}, nil
	}
	return peekEntry(entry, fingerprint), nil
}

// peekEntry judges a request of fingerprint from the key's entry (Peek).
func peekEntry(entry Entry, fingerprint string) CheckResult {
	switch {
	case entry.Provisional:
	case entry.Digest != Digest(fingerprint):
		if entry.State != keystate.InProgress {
			return CheckResult{Verdict: Mismatch}
		}
	case entry.State == keystate.Completed:
		return CheckResult{Verdict: Replay, Entry: entry}
	}
	return CheckResult{Verdict: Undecided}
}

// PeekBatch judges the requests of refs, each with its fingerprint, as
// Peek does, in one pipeline: one round trip for all of them (a cluster
// sends one per node). A result whose key could not be read or decoded is
// Undecided: Postgres judges it. The error is set only when no key could
// be read at all.
func (c *Cache) PeekBatch(ctx context.Context, refs []keystate.Ref, fingerprints []string) ([]CheckResult, error) {
	results := make([]CheckResult, len(refs))
	cmds := make([]*redis.StringCmd, len(refs))
	_, err := c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, ref := range refs {
			cmds[i] = p.Get(ctx, c.Key(ref))
		}
		return nil
	})
	read := 0
	for i, cmd := range cmds {
		results[i] = CheckResult{Verdict: Undecided}
		raw, cerr := cmd.Bytes()
		switch {
		case errors.Is(cerr, redis.Nil):
			read++
			continue
		case cerr != nil:
			continue
		}
		read++
		entry, derr := Decode(raw)
		if derr != nil {
			continue
		}
		results[i] = peekEntry(entry, fingerprints[i])
	}
	if read == 0 && len(refs) > 0 && err != nil && !errors.Is(err, redis.Nil) {
		return results, fmt.Errorf("peek keys: %w", err)
	}
	return results, nil
}

// Watch subscribes to the settlement of ref: the apply script announces on
// the key's own sharded channel when a key in progress settles or goes
// (SPUBLISH, so a cluster keeps the message on the key's shard). The
// subscription holds a connection of its own: close it when done.
func (c *Cache) Watch(ctx context.Context, ref keystate.Ref) (*redis.PubSub, error) {
	ps := c.rdb.SSubscribe(ctx, c.Key(ref))
	if _, err := ps.Receive(ctx); err != nil {
		_ = ps.Close()
		return nil, fmt.Errorf("watch key: %w", err)
	}
	return ps, nil
}
