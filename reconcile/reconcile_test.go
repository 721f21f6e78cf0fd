package reconcile

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/oncetest"
	"github.com/onceonly/onceonly/outbox"
)

// bundle is a test's stack, with the reconciler's helpers.
type bundle struct{ *oncetest.Stack }

// setup returns a stack on the shared test servers unless opts say
// otherwise (oncetest.OnRedis, oncetest.OnPool).
func setup(t testing.TB, opts ...oncetest.StackOption) *bundle {
	t.Helper()
	return &bundle{oncetest.NewStack(t, opts...)}
}

// reconciler returns a reconciler on the stack, configured by cfg
// otherwise; failed keys live a minute unless cfg says how long.
func (b *bundle) reconciler(t testing.TB, cfg Config) *Reconciler {
	t.Helper()
	b.Configure(t, &cfg)
	if cfg.FailedTTL == 0 {
		cfg.FailedTTL = time.Minute
	}
	r, err := New(cfg)
	require.NoError(t, err)
	return r
}

func (b *bundle) pass(t *testing.T, r *Reconciler, dryRun bool) Report {
	t.Helper()
	rep, err := r.Pass(b.Ctx, dryRun)
	require.NoError(t, err)
	return rep
}

var owner = keystate.Owner{9}

// complete runs a key through claim and complete in Postgres only; its
// stored body names the key.
func (b *bundle) complete(t *testing.T, key string) {
	t.Helper()
	b.Complete(t, "s", key, `{"key":"`+key+`"}`)
}

func (b *bundle) raw(t *testing.T, key string) string {
	t.Helper()
	v, err := b.Redis.Get(b.Ctx, b.Cache.Key(keystate.Ref{Scope: "s", Key: key})).Result()
	require.NoError(t, err)
	return v
}

func (b *bundle) set(t *testing.T, name, value string) {
	t.Helper()
	require.NoError(t, b.Redis.Set(b.Ctx, name, value, time.Hour).Err())
}

// TestEveryDriftKindIsFoundAndRepaired injects each kind of drift and checks
// the report's counts, the repaired state, and that a second pass is clean.
func TestEveryDriftKindIsFoundAndRepaired(t *testing.T) {
	t.Parallel()
	oncetest.OnEachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		b := setup(t, oncetest.OnRedis(rdb))
		for i := range 8 {
			b.complete(t, fmt.Sprintf("k%d", i))
		}
		r := b.reconciler(t, Config{PageSize: 3})

		// Nothing is in Redis yet: every key is missing.
		rep := b.pass(t, r, false)
		require.EqualValues(t, 8, rep.Scanned)
		require.EqualValues(t, 8, rep.Missing)
		require.EqualValues(t, 8, rep.Repaired)
		b.RequireConverged(t)

		// Inject one of each kind.
		require.NoError(t, b.Redis.Del(b.Ctx, b.Cache.Key(keystate.Ref{Scope: "s", Key: "k0"})).Err())    // missing
		v := b.raw(t, "k1")                                                                               // completed:2:c...
		b.set(t, b.Cache.Key(keystate.Ref{Scope: "s", Key: "k1"}), strings.Replace(v, ":2:", ":1:", 1))   // stale (lower)
		b.set(t, b.Cache.Key(keystate.Ref{Scope: "s", Key: "k2"}), strings.Replace(v, ":2:", ":7:", 1))   // stale (higher)
		b.set(t, b.Cache.Key(keystate.Ref{Scope: "s", Key: "k3"}), "failed:2:c"+v[len("completed:2:c"):]) // wrong state
		b.set(t, b.Cache.Key(keystate.Ref{Scope: "s", Key: "k4"}), "not a onceonly value")                // corrupt
		require.NoError(t, b.Redis.Del(b.Ctx, b.Cache.Key(keystate.Ref{Scope: "s", Key: "k5"})).Err())
		require.NoError(t, b.Redis.HSet(b.Ctx, b.Cache.Key(keystate.Ref{Scope: "s", Key: "k5"}), "state", "completed").Err()) // corrupt (a hash)
		b.set(t, b.Cache.Key(keystate.Ref{Scope: "s", Key: "ghost"}), v)                                                      // orphan: no Postgres row
		b.set(t, b.Cache.Prefix()+"no-scope-separator", "x")                                                                  // orphan: not a key name
		_, err := b.Cache.Check(b.Ctx, keystate.Ref{Scope: "s", Key: "inflight"}, "v1:fp", owner, time.Minute)
		require.NoError(t, err) // live provisional claim: left alone
		const lease = 300 * time.Millisecond
		_, err = b.Cache.Check(b.Ctx, keystate.Ref{Scope: "s", Key: "abandoned"}, "v1:fp", owner, lease)
		require.NoError(t, err)
		extended, err := b.Redis.PExpire(b.Ctx, b.Cache.Key(keystate.Ref{Scope: "s", Key: "abandoned"}), time.Hour).Result()
		require.NoError(t, err)
		require.True(t, extended, "the claim outlived its lease before the test could extend it")
		oncetest.AwaitCacheLeaseOver(t, b.Ctx, b.Cache, keystate.Ref{Scope: "s", Key: "abandoned"}) // an orphan now

		dry := b.pass(t, r, true)
		rep = b.pass(t, r, false)
		for _, got := range []Report{dry, rep} {
			require.EqualValues(t, 8, got.Scanned)
			require.EqualValues(t, 2, got.InSync, "k6, k7")
			require.EqualValues(t, 1, got.Missing)
			require.EqualValues(t, 2, got.Stale)
			require.EqualValues(t, 1, got.WrongState)
			require.EqualValues(t, 2, got.Corrupt)
			require.EqualValues(t, 3, got.Orphaned)
			require.EqualValues(t, 1, got.InFlight)
		}
		require.Zero(t, dry.Repaired, "a dry run repairs nothing")
		require.True(t, dry.DryRun)
		require.EqualValues(t, 9, rep.Repaired)

		b.RequireConverged(t)
		for _, name := range []string{b.Cache.Key(keystate.Ref{Scope: "s", Key: "ghost"}), b.Cache.Key(keystate.Ref{Scope: "s", Key: "abandoned"}), b.Cache.Prefix() + "no-scope-separator"} {
			require.Zero(t, b.Redis.Exists(b.Ctx, name).Val(), "%s deleted", name)
		}
		e, found, err := b.Cache.Read(b.Ctx, keystate.Ref{Scope: "s", Key: "inflight"})
		require.NoError(t, err)
		require.True(t, found && e.Provisional, "the request in flight keeps its claim")
		e, _, err = b.Cache.Read(b.Ctx, keystate.Ref{Scope: "s", Key: "k1"})
		require.NoError(t, err)
		require.Equal(t, `{"key":"k1"}`, string(e.Response.Body), "a repair copies the stored response") //nolint:testifylint // encoded-compare: the copy is byte for byte, not just equal JSON

		again := b.pass(t, r, false)
		require.Zero(t, again.Drift())
		require.EqualValues(t, 8, again.InSync)
		require.EqualValues(t, 1, again.InFlight)
		require.EqualValues(t, 4, testutil.ToFloat64(r.metrics.passes.WithLabelValues(resultOK)))
		require.EqualValues(t, 2, testutil.ToFloat64(r.metrics.drift.WithLabelValues(kindStale)), "dry runs count in the report only")
	})
}

func TestFlushedRedisIsRefilled(t *testing.T) {
	t.Parallel()
	srv := oncetest.NewRedisServer(t)
	b := setup(t, oncetest.OnRedis(oncetest.RedisClient(t, srv.URL())))
	for i := range 25 {
		b.complete(t, fmt.Sprintf("k%d", i))
	}
	r := b.reconciler(t, Config{PageSize: 10})
	b.pass(t, r, false)
	require.NoError(t, b.Redis.FlushAll(b.Ctx).Err())
	rep := b.pass(t, r, false)
	require.EqualValues(t, 25, rep.Missing)
	require.EqualValues(t, 25, rep.Repaired)
	b.RequireConverged(t)
}

func TestDeadLeasesAreReaped(t *testing.T) {
	t.Parallel()
	oncetest.OnEachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		b := setup(t, oncetest.OnRedis(rdb))
		_, err := b.Store.Claim(b.Ctx, b.Pool, keystate.Ref{Scope: "s", Key: "dead"}, "v1:fp", owner, time.Millisecond)
		require.NoError(t, err)
		_, err = b.Store.Claim(b.Ctx, b.Pool, keystate.Ref{Scope: "s", Key: "alive"}, "v1:fp", owner, time.Hour)
		require.NoError(t, err)
		const grace = 10 * time.Millisecond
		oncetest.AwaitLeaseOver(t, b.Ctx, b.Pool, keystate.Ref{Scope: "s", Key: "dead"}, grace)
		r := b.reconciler(t, Config{ReapGrace: grace})

		dry := b.pass(t, r, true)
		require.EqualValues(t, 1, dry.LeasesReaped)
		k, _, err := b.Store.Get(b.Ctx, b.Pool, keystate.Ref{Scope: "s", Key: "dead"})
		require.NoError(t, err)
		require.Equal(t, keystate.InProgress, k.Status, "a dry run reaps nothing")

		rep := b.pass(t, r, false)
		require.EqualValues(t, 1, rep.LeasesReaped)
		k, _, err = b.Store.Get(b.Ctx, b.Pool, keystate.Ref{Scope: "s", Key: "dead"})
		require.NoError(t, err)
		require.Equal(t, keystate.Failed, k.Status)
		require.EqualValues(t, 2, k.Version)
		var events int
		require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM outbox WHERE key = 'dead' AND version = 2`).Scan(&events))
		require.Equal(t, 1, events, "the reap is an outbox event like any transition")
		// The same pass repaired Redis after reaping.
		b.RequireConverged(t)
		// The dead worker can no longer complete.
		_, err = b.Store.Complete(b.Ctx, b.Pool, keystate.Ref{Scope: "s", Key: "dead"}, owner, keystate.Response{Status: 201})
		require.ErrorIs(t, err, outbox.ErrLeaseLost)
		alive, _, err := b.Store.Get(b.Ctx, b.Pool, keystate.Ref{Scope: "s", Key: "alive"})
		require.NoError(t, err)
		require.Equal(t, keystate.InProgress, alive.Status)
	})
}

// TestOrphanScanCoversEveryMaster: on a cluster, values with no Postgres row
// are found and deleted on every master, not just the one a SCAN reaches.
func TestOrphanScanCoversEveryMaster(t *testing.T) {
	t.Parallel()
	rdb := oncetest.RedisClusterClient(t)
	b := setup(t, oncetest.OnRedis(rdb))
	b.complete(t, "live")
	const orphans = 60
	for i := range orphans {
		b.set(t, b.Cache.Key(keystate.Ref{Scope: "s", Key: fmt.Sprintf("ghost%d", i)}), "completed:1:c")
	}
	perMaster := func() []int64 {
		var counts []int64
		require.NoError(t, cache.ForEachNode(b.Ctx, rdb, func(ctx context.Context, node redis.UniversalClient) error {
			keys, err := node.Keys(ctx, b.Cache.Prefix()+"*").Result()
			counts = append(counts, int64(len(keys)))
			return err
		}))
		return counts
	}
	before := perMaster()
	require.Len(t, before, 3)
	for _, n := range before {
		require.Positive(t, n, "the orphans span every master: %v", before)
	}

	rep := b.pass(t, b.reconciler(t, Config{PageSize: 7}), false)
	require.EqualValues(t, orphans, rep.Orphaned)
	require.GreaterOrEqual(t, rep.RedisScanned, int64(orphans), "every master's keys were seen")
	after := perMaster()
	var left int64
	for _, n := range after {
		left += n
	}
	require.EqualValues(t, 1, left, "only the live key is left: %v", after)
}

// TestMasterDownMakesAPartialPass: with one cluster master down, a pass
// still reaps, expires and repairs what the other masters hold, counts what
// it could not check, and reports itself partial; once the master is back,
// the next pass is whole and refills it.
func TestMasterDownMakesAPartialPass(t *testing.T) {
	t.Parallel()
	st, cluster := oncetest.NewClusterStack(t)
	b := &bundle{st}
	const keys = 30
	b.CompleteKeys(t, "s", "k", keys)
	r := b.reconciler(t, Config{PageSize: 7})
	require.EqualValues(t, keys, b.pass(t, r, false).Repaired)

	down := cluster.Nodes[1]
	down.Stop()
	// Drift on a master that is up: a deleted key.
	var onLiveMaster string
	for i := range keys {
		key := fmt.Sprintf("k%d", i)
		slot, err := cluster.Nodes[0].Client(t).ClusterKeySlot(b.Ctx, b.Cache.Key(keystate.Ref{Scope: "s", Key: key})).Result()
		require.NoError(t, err)
		if owner, err := cluster.Owner(b.Ctx, int(slot)); err == nil && owner != down {
			onLiveMaster = key
			break
		}
	}
	require.NotEmpty(t, onLiveMaster)
	require.NoError(t, b.Redis.Del(b.Ctx, b.Cache.Key(keystate.Ref{Scope: "s", Key: onLiveMaster})).Err())

	rep := b.pass(t, r, false)
	require.Positive(t, rep.Unreachable, "the down master's keys are counted, not called missing")
	require.EqualValues(t, 1, rep.UnreachableNodes)
	require.EqualValues(t, keys, rep.Scanned+rep.Unreachable)
	require.EqualValues(t, 1, rep.Missing)
	require.EqualValues(t, 1, rep.Repaired, "the other masters are repaired")
	require.EqualValues(t, 1, testutil.ToFloat64(r.metrics.passes.WithLabelValues(resultPartial)))

	down.Start()
	cluster.WaitHealthy()
	rep = b.pass(t, r, false)
	require.Zero(t, rep.Unreachable+rep.UnreachableNodes)
	require.EqualValues(t, keys, rep.Scanned)
	require.Positive(t, rep.Repaired, "the restarted master is refilled")
	b.RequireConverged(t)
}

func TestExpiredKeysAreDeletedInBatches(t *testing.T) {
	t.Parallel()
	oncetest.OnEachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		b := setup(t, oncetest.OnRedis(rdb))
		for i := range 7 {
			b.complete(t, fmt.Sprintf("old%d", i))
		}
		b.complete(t, "fresh")
		_, err := b.Pool.Exec(b.Ctx, `UPDATE idempotency_keys SET expires_at = now() - interval '1s' WHERE key LIKE 'old%'`)
		require.NoError(t, err)
		r := b.reconciler(t, Config{PageSize: 3})
		require.EqualValues(t, 7, b.pass(t, r, true).ExpiredDeleted)
		rep := b.pass(t, r, false)
		require.EqualValues(t, 7, rep.ExpiredDeleted)
		require.EqualValues(t, 1, rep.Scanned)
		var left int
		require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM idempotency_keys`).Scan(&left))
		require.Equal(t, 1, left)
	})
}

func TestOnePassAtATime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 50 {
		b.complete(t, fmt.Sprintf("k%d", i))
	}
	// Hold the pass lock as another instance would.
	conn, err := b.Pool.Acquire(b.Ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(b.Ctx, `SELECT pg_advisory_lock($1)`, int64(lockKey))
	require.NoError(t, err)
	r := b.reconciler(t, Config{})
	rep := b.pass(t, r, false)
	require.True(t, rep.Skipped)
	require.Zero(t, rep.Scanned)
	_, err = conn.Exec(b.Ctx, `SELECT pg_advisory_unlock($1)`, int64(lockKey))
	require.NoError(t, err)

	// Two reconcilers racing: the passes never overlap, and every run pass
	// sees the whole keyspace.
	var wg sync.WaitGroup
	var active, overlaps atomic.Int32
	reports := make([]Report, 6)
	errs := make([]error, len(reports))
	for i := range reports {
		rr := b.reconciler(t, Config{PageSize: 5})
		rr.inPass = func() {
			if active.Add(1) > 1 {
				overlaps.Add(1)
			}
			time.Sleep(30 * time.Millisecond) // a pass that takes a while, so racing passes would overlap it
			active.Add(-1)
		}
		wg.Go(func() {
			reports[i], errs[i] = rr.Pass(b.Ctx, false)
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	var ran, repaired int64
	for _, rep := range reports {
		if !rep.Skipped {
			ran++
			require.EqualValues(t, 50, rep.Scanned)
			repaired += rep.Repaired
		}
	}
	require.Positive(t, ran)
	require.Less(t, ran, int64(len(reports)), "racing passes skip rather than queue")
	require.Zero(t, overlaps.Load(), "passes never overlap")
	require.EqualValues(t, 50, repaired, "each key repaired once, by whichever pass ran first")
	b.RequireConverged(t)
}

// TestOnlyDisagreeingBucketsAreProbed: a pass with nothing out of step
// looks no Redis key up in Postgres; an orphan among many keys in step is
// found by looking up only the few keys of its hash bucket.
func TestOnlyDisagreeingBucketsAreProbed(t *testing.T) {
	t.Parallel()
	oncetest.OnEachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		b := setup(t, oncetest.OnRedis(rdb))
		const keys = 300
		b.CompleteKeys(t, "s", "k", keys)
		r := b.reconciler(t, Config{PageSize: 50})
		require.EqualValues(t, keys, b.pass(t, r, false).Repaired)

		rep := b.pass(t, r, false)
		require.Zero(t, rep.Drift())
		require.EqualValues(t, keys, rep.InSync)
		require.EqualValues(t, keys, rep.RedisScanned)
		require.Zero(t, rep.RedisProbed, "nothing out of step: no lookup")

		ghost := b.Cache.Key(keystate.Ref{Scope: "s", Key: "ghost"})
		b.set(t, ghost, b.raw(t, "k1"))
		for _, dryRun := range []bool{true, false} {
			rep = b.pass(t, r, dryRun)
			require.EqualValues(t, 1, rep.Orphaned)
			require.EqualValues(t, keys, rep.InSync)
			require.EqualValues(t, keys+1, rep.RedisScanned)
			require.Positive(t, rep.RedisProbed)
			require.Less(t, rep.RedisProbed, int64(10), "only the orphan's bucket is looked up")
		}
		require.Zero(t, b.Redis.Exists(b.Ctx, ghost).Val(), "the orphan is deleted")
		require.Zero(t, b.pass(t, r, false).RedisProbed)
	})
}

// TestWriteSinceTheScanIsNotDrift: a key whose Redis value differs from the
// row the scan read, but matches its current row (written since), is in
// step, not drift, and is left alone.
func TestWriteSinceTheScanIsNotDrift(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.complete(t, "k")
	ref := keystate.Ref{Scope: "s", Key: "k"}
	r := b.reconciler(t, Config{})
	require.EqualValues(t, 1, b.pass(t, r, false).Repaired)
	headers, err := b.Cache.ReadHeaders(b.Ctx, []string{b.Cache.Key(ref)})
	require.NoError(t, err)
	scanned := keystate.Key{Ref: ref, Status: keystate.InProgress, Version: 1} // the row as an earlier scan read it
	require.Equal(t, kindStale, compare(scanned, headers[0]))

	var rep Report
	require.NoError(t, r.repair(b.Ctx, &rep, []drift{{ref: ref, header: headers[0]}}))
	require.Zero(t, rep.Drift())
	require.EqualValues(t, 1, rep.InSync)
	require.Zero(t, rep.Repaired)

	// Drift the current row still shows is counted and repaired.
	require.NoError(t, b.Redis.Del(b.Ctx, b.Cache.Key(ref)).Err())
	headers, err = b.Cache.ReadHeaders(b.Ctx, []string{b.Cache.Key(ref)})
	require.NoError(t, err)
	rep = Report{}
	require.NoError(t, r.repair(b.Ctx, &rep, []drift{{ref: ref, header: headers[0]}}))
	require.EqualValues(t, 1, rep.Missing)
	require.EqualValues(t, 1, rep.Repaired)
	b.RequireConverged(t)
}

// TestStartStop: Start runs passes on the schedule in the background, Stop
// waits for the pass under way and returns once the reconciler has stopped
// (goleak, in TestMain, finds any goroutine left), a second Stop and a Stop
// without Start do nothing, and a stopped reconciler starts again.
func TestStartStop(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.reconciler(t, Config{Schedule: "@every 1s"})
	r.Stop() // never started
	entered, release := make(chan struct{}, 1), make(chan struct{})
	var finished atomic.Bool
	r.inPass = func() {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-release
		finished.Store(true)
	}
	require.NoError(t, r.Start(b.Ctx))
	require.NoError(t, r.Start(b.Ctx), "starting a running reconciler does nothing")
	<-r.Started()
	<-entered // a pass is under way, held
	stopped := make(chan bool)
	go func() {
		r.Stop()
		stopped <- finished.Load()
	}()
	close(release)
	require.True(t, <-stopped, "Stop returned before the pass under way")
	select {
	case <-r.Stopped():
	default:
		t.Fatal("Stopped is open after Stop")
	}
	r.Stop()

	finished.Store(false)
	require.NoError(t, r.Start(b.Ctx))
	<-entered
	oncetest.Eventually(t, 5*time.Second, "the restarted schedule runs a pass", finished.Load)
	r.Stop()
}

// TestRunEndsWithItsContext: Run returns nil once its context ends.
func TestRunEndsWithItsContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.reconciler(t, Config{Schedule: "@every 1h"})
	ctx, cancel := context.WithCancel(b.Ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	<-r.Started()
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s of its context's end")
	}
}

// TestStaleWhileAStepRunsIsExplained: a key whose execution waits on a
// step's call while Redis still holds the provisional claim of its request
// (Postgres's claim has not reached Redis) is stale, and the pass says why
// at Info, naming the step in flight; a provisional claim under a live
// lease is left alone.
func TestStaleWhileAStepRunsIsExplained(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ref := keystate.Ref{Scope: "s", Key: "stepping"}
	_, err := b.Cache.Check(b.Ctx, ref, "v1:fp", owner, time.Minute) // the request's provisional claim
	require.NoError(t, err)
	claim, err := b.Store.Claim(b.Ctx, b.Pool, ref, "v1:fp", owner, time.Minute)
	require.NoError(t, err)
	require.True(t, claim.Claimed)
	require.NoError(t, b.Store.RecordStep(b.Ctx, b.Pool, ref, owner, "authorize", []byte(`{"outcome":"ok"}`), "h", []byte("{}"), false))
	require.NoError(t, b.Store.RecordStep(b.Ctx, b.Pool, ref, owner, "charge", []byte(`{}`), "h", nil, false))
	logs := &oncetest.LogBuffer{}
	r := b.reconciler(t, Config{Logger: slog.New(slog.NewTextHandler(logs, nil))})

	rep := b.pass(t, r, false)
	require.EqualValues(t, 1, rep.Stale)
	require.Contains(t, logs.String(), `level=INFO msg="reconcile: key stale while its execution runs a step; the relay delivers its state" scope=s key=stepping step=charge steps_settled=authorize postgres_version=1 redis_version=0 redis_provisional=true`)
	e, found, err := b.Cache.Read(b.Ctx, ref)
	require.NoError(t, err)
	require.True(t, found && e.Provisional, "the live provisional claim is left alone")
}
