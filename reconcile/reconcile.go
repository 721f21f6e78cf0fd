// Package reconcile finds and repairs every difference between the Postgres
// truth and the Redis cache, reaps the leases of dead workers and deletes
// expired keys.
//
// A pass runs under a Postgres advisory lock held by a transaction open for
// the pass, so one runs at a time across all instances, also through
// PgBouncer in transaction mode. It streams both sides side by side: one
// statement reads every live row of idempotency_keys in the table's physical
// order, in pages whose Redis headers are read in one pipeline each, while a
// SCAN walks the Redis keyspace (every master of a cluster). Both sides sum
// hashes of the Redis names they saw per bucket (see tally); only the Redis
// keys of buckets where the sums differ, none when nothing drifted, are then
// looked up in Postgres to find the orphans. Memory does not grow with the
// number of keys.
//
// Repairs are compare-and-set writes of the key's current Postgres row: a
// repair applies only if the Redis value is still the one the pass saw, so a
// pass never undoes a newer write by the api or the relay, and never touches
// a provisional claim under a live lease (a request in flight).
package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/robfig/cron/v3"

	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/internal/defaults"
	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/outbox"
	"github.com/onceonly/onceonly/startstop"
)

// Defaults of Config.
const (
	DefaultSchedule    = "@every 1m"
	DefaultReapGrace   = time.Second
	DefaultPageSize    = 1000
	DefaultPassTimeout = 10 * time.Minute
)

// defaultCheckers is how many pages of the Postgres scan are checked in
// Redis at once: two keep Redis busy while a checker works on its page.
const defaultCheckers = 2

// lockKey is the advisory lock that admits one pass at a time.
const lockKey = 0x6f6e63656f6e6c79 // "onceonly"

// Config configures a Reconciler.
type Config struct {
	// Pool is the Postgres pool (required).
	Pool *pgxpool.Pool
	// Redis is the cache's Redis (required): a client, a cluster client or
	// a Sentinel failover client.
	Redis redis.UniversalClient
	// RedisPrefix prefixes every Redis key; it must be the engine's
	// Config.RedisPrefix (cache.DefaultPrefix, "idem:", when empty).
	RedisPrefix string
	// RedisWriteLayout1 is the rolling-upgrade switch of the engine's
	// Tuning.RedisWriteLayout1 (REDIS_WRITE_LAYOUT1): set it on every
	// process alike, and unset it once no release before 2026-11-24 runs.
	RedisWriteLayout1 bool
	// Schedule says when Run starts passes: a cron spec (5 fields) or
	// "@every <duration>" (RECONCILE_SCHEDULE; DefaultSchedule when empty).
	Schedule string
	// ReapGrace is how long after its lease ran out an in_progress key is
	// marked failed (REAP_GRACE).
	ReapGrace time.Duration
	// FailedTTL is how long a reaped key is kept (FAILED_TTL).
	FailedTTL time.Duration
	// PageSize is how many keys each page of the scans holds.
	PageSize int
	// PassTimeout bounds one pass.
	PassTimeout time.Duration
	// MaxCachedBody is the largest response body copied into Redis; it must
	// match the engine's (cache.DefaultMaxBody when zero).
	MaxCachedBody int
	// Logger receives one line per pass (slog.Default when nil).
	Logger *slog.Logger
	// Registerer receives the metrics; nil keeps them private.
	Registerer prometheus.Registerer
}

// Report is what one pass found and did. Its JSON form is the line
// `reconciler --once` prints.
type Report struct {
	// Scanned counts the live Postgres keys compared with Redis.
	Scanned int64 `json:"scanned"`
	InSync  int64 `json:"in_sync"`
	// Drift by kind: no Redis value; another version; the same version in
	// another state; a value that does not decode; a Redis value with no
	// live Postgres row.
	Missing    int64 `json:"missing"`
	Stale      int64 `json:"stale"`
	WrongState int64 `json:"wrong_state"`
	Corrupt    int64 `json:"corrupt"`
	Orphaned   int64 `json:"orphaned"`
	// InFlight counts provisional claims left alone: requests in flight.
	InFlight int64 `json:"in_flight"`
	// RedisScanned counts the Redis keys the orphan scan saw.
	RedisScanned int64 `json:"redis_scanned"`
	// RedisProbed counts the Redis keys looked up in Postgres: those whose
	// hash bucket the two scans disagreed on (see tally).
	RedisProbed int64 `json:"redis_probed"`
	// Unreachable counts the live keys, and UnreachableNodes the Redis
	// servers (cluster masters) for the orphan scan, that could not be
	// checked because Redis could not serve them: the pass was partial.
	Unreachable      int64 `json:"unreachable"`
	UnreachableNodes int64 `json:"unreachable_nodes"`
	// Repaired counts the drifted keys written or deleted.
	Repaired     int64 `json:"repaired"`
	LeasesReaped int64 `json:"leases_reaped"`
	// StuckExecutions counts the keys in progress with a step started whose
	// lease ran out more than ReapGrace ago: executions no live engine has
	// resumed (the reaper leaves them alone).
	StuckExecutions int64 `json:"stuck_executions"`
	ExpiredDeleted  int64 `json:"expired_deleted"`
	DurationMs      int64 `json:"duration_ms"`
	DryRun          bool  `json:"dry_run"`
	// Skipped is true when another instance held the pass lock.
	Skipped bool `json:"skipped"`
}

// Drift returns the number of drifted keys found.
func (r *Report) Drift() int64 {
	return r.Missing + r.Stale + r.WrongState + r.Corrupt + r.Orphaned
}

// Reconciler runs passes: one at a time with Pass, or on the schedule with
// Run (blocking) or Start and Stop (in the background).
type Reconciler struct {
	life    startstop.Base
	cfg     Config
	store   *outbox.Store
	cache   *cache.Cache
	log     *slog.Logger
	metrics *metrics
	// inPass, when set (tests), runs at the start of every pass, under the
	// pass lock.
	inPass func()
	// checkers is how many pages of the Postgres scan are checked in Redis
	// at once.
	checkers int
}

// New returns a Reconciler.
func New(cfg Config) (*Reconciler, error) {
	if cfg.Pool == nil || cfg.Redis == nil {
		return nil, errors.New("reconcile: Pool and Redis are required")
	}
	if cfg.Schedule == "" {
		cfg.Schedule = DefaultSchedule
	}
	if _, err := cron.ParseStandard(cfg.Schedule); err != nil {
		return nil, fmt.Errorf("reconcile: schedule %q: %w", cfg.Schedule, err)
	}
	defaults.Positive(&cfg.ReapGrace, DefaultReapGrace)
	defaults.Positive(&cfg.PageSize, DefaultPageSize)
	defaults.Positive(&cfg.PassTimeout, DefaultPassTimeout)
	defaults.Positive(&cfg.MaxCachedBody, cache.DefaultMaxBody)
	defaults.Logger(&cfg.Logger)
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("reconcile: %w", err)
	}
	return &Reconciler{
		cfg:      cfg,
		store:    outbox.New(outbox.Config{FailedTTL: cfg.FailedTTL}),
		cache:    cache.New(cfg.Redis, cache.Options{Prefix: cfg.RedisPrefix, MaxBody: cfg.MaxCachedBody, WriteLayout1: cfg.RedisWriteLayout1}),
		log:      cfg.Logger,
		metrics:  m,
		checkers: defaultCheckers,
	}, nil
}

// Pass runs one pass: reap dead leases, delete expired keys, compare every
// live key with Redis, then look for Redis keys with no live row. With
// dryRun it counts everything and changes nothing. When another instance is
// running a pass, it returns at once with Report.Skipped set.
func (r *Reconciler) Pass(ctx context.Context, dryRun bool) (_ Report, err error) {
	began := time.Now()
	ctx, cancel := context.WithTimeout(ctx, r.cfg.PassTimeout)
	defer cancel()
	rep := Report{DryRun: dryRun}
	ctx, span := tracer.Start(ctx, "onceonly.reconcile.pass")
	defer span.End()
	defer func() { tracePass(span, &rep, err) }()

	// The pass lock belongs to a transaction kept open for the pass and
	// rolled back after it (a lost connection ends it too), so it holds on
	// any connection, a PgBouncer's in transaction mode included. On Citus
	// it is the coordinator's advisory lock (try_lock reads no table): it
	// admits one pass at a time as long as every reconciler's DATABASE_URL
	// is the coordinator, as docs/citus.md has it (a reconciler pointed at a
	// worker would take that worker's lock instead).
	lockTx, err := r.cfg.Pool.Begin(ctx)
	if err != nil {
		return rep, r.failed(fmt.Errorf("reconcile: take pass lock: %w", err))
	}
	defer func() { _ = lockTx.Rollback(context.WithoutCancel(ctx)) }()
	locked, err := r.store.TryLock(ctx, lockTx, lockKey)
	if err != nil {
		return rep, r.failed(fmt.Errorf("reconcile: take pass lock: %w", err))
	}
	if !locked {
		rep.Skipped = true
		r.metrics.passes.WithLabelValues(resultSkipped).Inc()
		r.log.Info("reconcile pass skipped: another instance is running one")
		return rep, nil
	}

	err = r.pass(ctx, lockTx, &rep)
	rep.DurationMs = time.Since(began).Milliseconds()
	if err != nil {
		err = r.failed(fmt.Errorf("reconcile: %w", err))
		r.remember(ctx, resultFailed, rep, time.Since(began), err)
		return rep, err
	}
	r.remember(ctx, r.record(rep, time.Since(began)), rep, time.Since(began), nil)
	return rep, nil
}

func (r *Reconciler) pass(ctx context.Context, lockTx pgx.Tx, rep *Report) error {
	if r.inPass != nil {
		r.inPass()
	}
	if err := r.reap(ctx, rep); err != nil {
		return err
	}
	if err := r.expire(ctx, rep); err != nil {
		return err
	}
	// The two scans are independent: run them side by side, so Postgres and
	// Redis work overlap. The Postgres scan streams on the lock's
	// transaction, idle otherwise.
	t := newTally()
	pgSide, redisSide := Report{DryRun: rep.DryRun}, Report{DryRun: rep.DryRun}
	unreachable := map[string]bool{}
	scanCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		err := r.tallyRedis(scanCtx, &redisSide, t, unreachable)
		if err != nil {
			cancel()
		}
		errc <- err
	}()
	pgErr := r.scanPostgres(scanCtx, lockTx, &pgSide, t)
	if pgErr != nil {
		cancel()
	}
	redisErr := <-errc
	rep.add(pgSide)
	rep.add(redisSide)
	if err := errors.Join(pgErr, redisErr); err != nil {
		return err
	}
	if t.dirtyBuckets() == 0 {
		return nil // every Redis name has a live row: no orphan
	}
	return r.findOrphans(ctx, rep, t, unreachable)
}

// add adds the scan counts of o to rep.
func (rep *Report) add(o Report) {
	rep.Scanned += o.Scanned
	rep.InSync += o.InSync
	rep.Missing += o.Missing
	rep.Stale += o.Stale
	rep.WrongState += o.WrongState
	rep.Corrupt += o.Corrupt
	rep.Orphaned += o.Orphaned
	rep.InFlight += o.InFlight
	rep.RedisScanned += o.RedisScanned
	rep.RedisProbed += o.RedisProbed
	rep.Unreachable += o.Unreachable
	rep.UnreachableNodes += o.UnreachableNodes
	rep.Repaired += o.Repaired
}

// reap marks keys whose lease expired more than ReapGrace ago failed.
func (r *Reconciler) reap(ctx context.Context, rep *Report) error {
	stuck, err := r.store.CountStuck(ctx, r.cfg.Pool, r.cfg.ReapGrace)
	if err != nil {
		return err
	}
	rep.StuckExecutions = int64(stuck)
	if rep.DryRun {
		n, err := r.store.CountReapable(ctx, r.cfg.Pool, r.cfg.ReapGrace)
		rep.LeasesReaped = int64(n)
		return err
	}
	for {
		n, err := r.store.ReapLeases(ctx, r.cfg.Pool, r.cfg.ReapGrace, r.cfg.PageSize)
		rep.LeasesReaped += int64(n)
		if err != nil || n < r.cfg.PageSize {
			return err
		}
	}
}

// expire deletes expired keys in bounded batches.
func (r *Reconciler) expire(ctx context.Context, rep *Report) error {
	if rep.DryRun {
		n, err := r.store.CountExpired(ctx, r.cfg.Pool)
		rep.ExpiredDeleted = int64(n)
		return err
	}
	for {
		n, err := r.store.DeleteExpired(ctx, r.cfg.Pool, r.cfg.PageSize)
		rep.ExpiredDeleted += int64(n)
		if err != nil || n < r.cfg.PageSize {
			return err
		}
	}
}

// scanPostgres compares every live key with its Redis header, page by page,
// and repairs the drifted ones; it adds the name of every key whose Redis
// value it found to t.postgres. The scan streams on tx and fills the next
// pages while checkers check the previous ones in Redis, each its own page,
// so the scan, Redis and the checkers' CPU work overlap.
func (r *Reconciler) scanPostgres(ctx context.Context, tx pgx.Tx, rep *Report, t *tally) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Pages go round: one filling, one waiting, one per checker.
	checkers := max(r.checkers, 1)
	buffers := checkers + 2
	free, full := make(chan []keystate.Key, buffers), make(chan []keystate.Key, 1)
	for range buffers {
		free <- make([]keystate.Key, 0, r.cfg.PageSize)
	}
	scanErr := make(chan error, 1)
	go func() {
		defer close(full)
		page := <-free
		send := func() error {
			select {
			case full <- page:
			case <-ctx.Done():
				return ctx.Err()
			}
			page = (<-free)[:0] // never waits long: checkers hand pages back at once
			return nil
		}
		err := r.store.ScanLive(ctx, tx, func(k keystate.Key) error {
			page = append(page, k)
			if len(page) < r.cfg.PageSize {
				return nil
			}
			return send()
		})
		if err == nil && len(page) > 0 {
			err = send()
		}
		scanErr <- err
	}()
	reports, errs := make([]Report, checkers), make([]error, checkers)
	var wg sync.WaitGroup
	for i := range checkers {
		reports[i].DryRun = rep.DryRun
		wg.Go(func() {
			names := make([]string, 0, r.cfg.PageSize)
			for page := range full {
				if errs[i] == nil {
					if errs[i] = r.checkPage(ctx, &reports[i], t, page, names); errs[i] != nil {
						cancel() // stops the scan and the other checkers
					}
				}
				free <- page
			}
		})
	}
	wg.Wait()
	for i := range checkers {
		rep.add(reports[i])
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return <-scanErr
}

// checkPage compares a page of live keys with their Redis headers and
// repairs the drifted ones, adding the names of the keys found in Redis to
// t. names is scratch space.
func (r *Reconciler) checkPage(ctx context.Context, rep *Report, t *tally, page []keystate.Key, names []string) error {
	names = names[:0]
	for _, k := range page {
		names = append(names, r.cache.Key(k.Ref))
	}
	headers, err := r.cache.ReadHeaders(ctx, names)
	if err != nil {
		return err
	}
	var drifted []drift
	for i, k := range page {
		h := headers[i]
		if h.Unavailable {
			rep.Unreachable++ // its cluster node is down; the next pass sees it
			continue
		}
		if h.Found {
			t.add(t.postgres, names[i])
		}
		rep.Scanned++
		switch kind := compare(k, h); kind {
		case kindInSync:
			rep.InSync++
		case kindInFlight:
			rep.InFlight++
		default:
			drifted = append(drifted, drift{ref: k.Ref, header: h})
		}
	}
	return r.repair(ctx, rep, drifted)
}

// The kinds of drift, and the two verdicts that are not drift.
const (
	kindInSync     = "in_sync"
	kindInFlight   = "in_flight"
	kindMissing    = "missing"
	kindStale      = "stale"
	kindWrongState = "wrong_state"
	kindCorrupt    = "corrupt"
	kindOrphaned   = "orphaned"
)

var driftKinds = []string{kindMissing, kindStale, kindWrongState, kindCorrupt, kindOrphaned}

// compare classifies a live Postgres key against its Redis header.
func compare(k keystate.Key, h cache.Header) string {
	switch {
	case !h.Found:
		return kindMissing
	case h.Corrupt:
		return kindCorrupt
	case h.Provisional && h.Version == k.Version:
		// A request re-claiming a failed key: Postgres hears of it next.
		return kindInFlight
	case h.Version != k.Version:
		return kindStale
	case h.State != k.Status:
		return kindWrongState
	}
	return kindInSync
}

func (rep *Report) count(kind string) {
	switch kind {
	case kindMissing:
		rep.Missing++
	case kindStale:
		rep.Stale++
	case kindWrongState:
		rep.WrongState++
	case kindCorrupt:
		rep.Corrupt++
	case kindOrphaned:
		rep.Orphaned++
	}
}

// drift is a key found out of step, with the Redis header the pass saw.
type drift struct {
	ref    keystate.Ref
	header cache.Header
}

// repair reads the current Postgres row of each key found out of step and
// compares it again with the Redis header the pass saw: a key written since
// its row was scanned may be in step now, and is not drift. The others are
// counted and, unless in a dry run, repaired: the current row is written
// into Redis, or the Redis value of a key Postgres no longer has deleted,
// each as a compare-and-set against the header the pass saw.
func (r *Reconciler) repair(ctx context.Context, rep *Report, drifted []drift) error {
	if len(drifted) == 0 {
		return nil
	}
	refs := make([]keystate.Ref, len(drifted))
	for i, d := range drifted {
		refs[i] = d.ref
	}
	current, err := r.store.CurrentKeys(ctx, r.cfg.Pool, refs, r.cfg.MaxCachedBody)
	if err != nil {
		return err
	}
	var keys, running []keystate.Key
	var names, expect []string
	var runningSeen []cache.Header
	for _, d := range drifted {
		k, ok := current[d.ref]
		kind := compare(k, d.header)
		if !ok { // a row when scanned, none now
			k, kind = keystate.Gone(d.ref, 0), kindOrphaned
			if !d.header.Found {
				kind = kindInSync // nothing on either side
			}
		}
		switch kind {
		case kindInSync:
			rep.InSync++
			continue
		case kindInFlight:
			rep.InFlight++
			continue
		}
		rep.count(kind)
		if !rep.DryRun {
			r.metrics.drift.WithLabelValues(kind).Inc()
		}
		if kind == kindStale && k.Status == keystate.InProgress {
			running, runningSeen = append(running, k), append(runningSeen, d.header)
		}
		keys, names, expect = append(keys, k), append(names, r.cache.Key(d.ref)), append(expect, d.header.Expect())
	}
	r.explainStale(ctx, running, runningSeen)
	if rep.DryRun || len(keys) == 0 {
		return nil // a dry run counts in its report only
	}
	results, err := r.cache.RepairBatch(ctx, keys, expect)
	if err != nil {
		return err
	}
	r.countRepairs(rep, names, results)
	return nil
}

// explainStale logs, at Info, why each key of running (stale, its
// execution in progress) that recorded a step was stale: Redis holds an
// older version of the execution than Postgres (seen), most often the
// provisional claim of the request that runs it, because the claim, a
// takeover or a hand-off has not reached Redis yet (the relay delivers it;
// a provisional claim under a live lease is not overwritten). An execution
// waiting on an external call is expected to be so; nothing is wrong. It
// names the steps, the one in flight first. A key without a step is left
// to the pass's counts, and a failure to read the steps only costs the
// explanation.
func (r *Reconciler) explainStale(ctx context.Context, running []keystate.Key, seen []cache.Header) {
	if len(running) == 0 || !r.log.Enabled(ctx, slog.LevelInfo) {
		return
	}
	refs := make([]keystate.Ref, len(running))
	for i, k := range running {
		refs[i] = k.Ref
	}
	steps, err := r.store.StepsInProgress(ctx, r.cfg.Pool, refs)
	if err != nil {
		r.log.Debug("reconcile: read the steps of stale keys in progress", "err", err)
		return
	}
	for i, k := range running {
		recorded := steps[k.Ref]
		if len(recorded) == 0 {
			continue
		}
		var inFlight, settled []string
		for _, s := range recorded {
			if s.Settled {
				settled = append(settled, s.Name)
			} else {
				inFlight = append(inFlight, s.Name)
			}
		}
		r.log.Info("reconcile: key stale while its execution runs a step; the relay delivers its state",
			"scope", k.Scope, "key", k.Key, "step", strings.Join(inFlight, ","), "steps_settled", strings.Join(settled, ","),
			"postgres_version", k.Version, "redis_version", seen[i].Version, "redis_provisional", seen[i].Provisional)
	}
}

// walkRedis SCANs the keyspace under the prefix on every master of a
// cluster, one after the other, and calls visit with each page of names. A
// node that cannot serve (a cluster master down) is skipped and added to
// unreachable; the walk fails only when no node could be walked.
func (r *Reconciler) walkRedis(ctx context.Context, unreachable map[string]bool, visit func(ctx context.Context, node redis.UniversalClient, page []string) error) error {
	match := escapeGlob(r.cache.Prefix()) + "*"
	walk := func(ctx context.Context, node redis.UniversalClient) error {
		iter := node.Scan(ctx, 0, match, int64(r.cfg.PageSize)).Iterator()
		page := make([]string, 0, r.cfg.PageSize)
		for iter.Next(ctx) {
			page = append(page, iter.Val())
			if len(page) == r.cfg.PageSize {
				if err := visit(ctx, node, page); err != nil {
					return err
				}
				page = page[:0]
			}
		}
		if err := iter.Err(); err != nil {
			if cache.Unavailable(err) {
				return fmt.Errorf("scan Redis: %w: %w", cache.ErrUnavailable, err)
			}
			return fmt.Errorf("scan Redis: %w", err)
		}
		if len(page) == 0 {
			return nil
		}
		return visit(ctx, node, page)
	}
	var nodes, failed int
	var lastErr error
	err := cache.ForEachNode(ctx, r.cache.Client(), func(ctx context.Context, node redis.UniversalClient) error {
		nodes++
		err := walk(ctx, node)
		if err != nil && errors.Is(err, cache.ErrUnavailable) {
			failed++
			unreachable[nodeAddr(node)] = true
			lastErr = err
			return nil
		}
		return err
	})
	if err == nil && nodes > 0 && failed == nodes {
		return fmt.Errorf("scan Redis: no server could be scanned: %w", lastErr)
	}
	return err
}

// nodeAddr names a Redis server for the count of unreachable ones.
func nodeAddr(node redis.UniversalClient) string {
	if c, ok := node.(interface{ Options() *redis.Options }); ok {
		return c.Options().Addr
	}
	return fmt.Sprintf("%p", node)
}

// tallyRedis walks the Redis keyspace and adds every name to t.
func (r *Reconciler) tallyRedis(ctx context.Context, rep *Report, t *tally, unreachable map[string]bool) error {
	err := r.walkRedis(ctx, unreachable, func(_ context.Context, _ redis.UniversalClient, page []string) error {
		rep.RedisScanned += int64(len(page))
		for _, name := range page {
			t.add(t.redis, name)
		}
		return nil
	})
	rep.UnreachableNodes = int64(len(unreachable))
	return err
}

// findOrphans, once both scans are over, walks the Redis keyspace again and
// checks the names of t's dirty buckets, the only ones that can be orphans.
func (r *Reconciler) findOrphans(ctx context.Context, rep *Report, t *tally, unreachable map[string]bool) error {
	var suspects []string
	err := r.walkRedis(ctx, unreachable, func(ctx context.Context, node redis.UniversalClient, page []string) error {
		suspects = suspects[:0]
		for _, name := range page {
			if t.dirty(name) {
				suspects = append(suspects, name)
			}
		}
		rep.RedisProbed += int64(len(suspects))
		return r.checkOrphans(ctx, rep, node, suspects)
	})
	rep.UnreachableNodes = int64(len(unreachable))
	return err
}

// checkOrphans finds the values among page (Redis key names, all on node)
// whose key has no live Postgres row, and deletes them unless they are
// provisional claims under a live lease.
func (r *Reconciler) checkOrphans(ctx context.Context, rep *Report, node redis.Cmdable, page []string) error {
	if len(page) == 0 {
		return nil
	}
	live, err := r.store.Live(ctx, r.cfg.Pool, refsOf(r.cache.Prefix(), page))
	if err != nil {
		return err
	}
	// Only keys with no live row are candidates; read just their headers.
	var candidates []string
	for _, name := range page {
		ref, ok := cache.SplitKeyName(r.cache.Prefix(), name)
		if !ok || !live[ref] {
			candidates = append(candidates, name)
		}
	}
	if len(candidates) == 0 {
		return nil
	}
	headers, err := r.cache.ReadHeaders(ctx, candidates)
	if err != nil {
		return err
	}
	nowMs, err := cache.RedisTimeMs(ctx, node)
	if err != nil {
		return err
	}
	// Look again now that the headers are read: a key written since the
	// first look is live now, and any later write changes the header, so the
	// compare-and-set delete below cannot remove it.
	if live, err = r.store.Live(ctx, r.cfg.Pool, refsOf(r.cache.Prefix(), candidates)); err != nil {
		return err
	}
	var names, expect []string
	for i, name := range candidates {
		h := headers[i]
		if !h.Found {
			continue // expired since the SCAN
		}
		if ref, ok := cache.SplitKeyName(r.cache.Prefix(), name); ok && live[ref] {
			continue
		}
		if h.Provisional && h.LeaseUntilMs > nowMs {
			rep.InFlight++ // a request on its way to Postgres
			continue
		}
		rep.Orphaned++
		names, expect = append(names, name), append(expect, h.Expect())
	}
	if rep.DryRun || len(names) == 0 {
		return nil
	}
	r.metrics.drift.WithLabelValues(kindOrphaned).Add(float64(len(names)))
	results, err := r.cache.DeleteBatch(ctx, names, expect)
	if err != nil {
		return err
	}
	r.countRepairs(rep, names, results)
	return nil
}

// refsOf returns the idempotency keys of the Redis key names that parse.
func refsOf(prefix string, names []string) []keystate.Ref {
	refs := make([]keystate.Ref, 0, len(names))
	for _, name := range names {
		if ref, ok := cache.SplitKeyName(prefix, name); ok {
			refs = append(refs, ref)
		}
	}
	return refs
}

// countRepairs counts the applied results and logs the failed ones.
func (r *Reconciler) countRepairs(rep *Report, names []string, results []cache.ApplyResult) {
	for i, res := range results {
		switch {
		case res.Err != nil:
			r.metrics.repairErrors.Inc()
			r.log.Warn("reconcile repair failed", "key", names[i], "err", res.Err)
		case res.Applied:
			rep.Repaired++
			r.metrics.repaired.Inc()
		}
	}
}

// escapeGlob escapes the SCAN MATCH metacharacters in s.
func escapeGlob(s string) string {
	var b strings.Builder
	for _, c := range s {
		if strings.ContainsRune(`*?[]\`, c) {
			b.WriteByte('\\')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// failed counts a failed pass and returns err.
func (r *Reconciler) failed(err error) error {
	r.metrics.passes.WithLabelValues(resultFailed).Inc()
	r.log.Error("reconcile pass failed", "err", err)
	return err
}

// record logs a finished pass (one line), updates the metrics and returns
// the pass's result.
func (r *Reconciler) record(rep Report, took time.Duration) string {
	result := resultOK
	if rep.Unreachable+rep.UnreachableNodes > 0 {
		result = resultPartial
		r.log.Warn("reconcile pass partial: Redis could not serve part of the keyspace",
			"unreachable_keys", rep.Unreachable, "unreachable_nodes", rep.UnreachableNodes)
	}
	r.metrics.passes.WithLabelValues(result).Inc()
	r.metrics.duration.Observe(took.Seconds())
	if !rep.DryRun {
		r.metrics.reaped.Add(float64(rep.LeasesReaped))
		r.metrics.stuck.Set(float64(rep.StuckExecutions))
		r.metrics.expired.Add(float64(rep.ExpiredDeleted))
		if result == resultOK {
			r.metrics.lastSuccess.SetToCurrentTime()
		}
	}
	r.log.Info("reconcile pass", "dry_run", rep.DryRun, "scanned", rep.Scanned, "in_sync", rep.InSync,
		"missing", rep.Missing, "stale", rep.Stale, "wrong_state", rep.WrongState, "corrupt", rep.Corrupt,
		"orphaned", rep.Orphaned, "in_flight", rep.InFlight, "redis_scanned", rep.RedisScanned,
		"repaired", rep.Repaired, "leases_reaped", rep.LeasesReaped, "expired_deleted", rep.ExpiredDeleted,
		"duration_ms", rep.DurationMs)
	return result
}
