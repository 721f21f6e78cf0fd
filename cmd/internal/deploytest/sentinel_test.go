package deploytest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/oncetest"
)

// TestSentinelFailoverUnderLoad kills the Redis primary (kill -9) while an
// engine on a Sentinel failover client runs first executions, concurrent
// duplicates, replays and reused keys, and the relay daemon (the real
// binary, on REDIS_SENTINEL_URL) delivers. The replica is cut off for a
// moment first, so it falls behind as a lagging replica does: the writes
// the primary acknowledged in that moment (completions, and the relay's
// deliveries) are not on the replica Sentinel promotes. The old primary then
// comes back empty and Sentinel makes it a replica.
//
// Throughout: every key runs once (I1), every answer for a key is the same
// (I2), a reused key is refused without running (I3), no two executions of
// a key overlap (I4), and no completed key answers "in flight" for long.
// Afterwards the relay and the engine work on the new primary, and once the
// relay has caught up Redis holds every key at its Postgres state and
// version: no key is left below it, as one would be if the relay had
// deleted events the promoted replica never got (its WAIT guard, on by
// default under Sentinel, keeps them).
func TestSentinelFailoverUnderLoad(t *testing.T) {
	t.Parallel()
	g := oncetest.NewSentinelGroup(t)
	ctx := oncetest.Context(t)
	dbURL := oncetest.DatabaseURL(t)
	pool := oncetest.Pool(t, dbURL)
	rdb := g.Client(t)
	prefix := oncetest.KeyPrefix(t, rdb)
	reg := prometheus.NewRegistry()
	engine, err := onceonly.New(onceonly.Config{Pool: pool, Redis: rdb, RedisPrefix: prefix,
		Logger: oncetest.QuietLogger(), Registerer: reg})
	require.NoError(t, err)
	t.Cleanup(engine.Close)
	relayd := oncetest.StartDaemon(t, oncetest.BuildBinary(t, root+"/cmd/relay"), "DATABASE_URL="+dbURL,
		"REDIS_SENTINEL_URL="+g.URL(), "REDIS_PREFIX="+prefix, "RELAY_POLL_INTERVAL=100ms",
		"RELAY_REDIS_WAIT_TIMEOUT=200ms")
	require.Contains(t, relayd.Logs.String(), "redis_wait_replicas=1", "the guard is on under Sentinel")

	keys := make([]string, 240)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%03d", i)
	}
	load := newFailoverLoad(engine)
	var timings failoverTimings
	load.run(t, ctx, keys, func() { timings = failover(t, ctx, g, rdb, prefix) })
	t.Logf("failover: Sentinel promoted the replica %s after the kill, the failover client wrote to it after %s; the old primary was back in sync %s after its restart; the longest request (retrying while in flight) took %s",
		timings.promoted.Round(time.Millisecond), timings.clientFollowed.Round(time.Millisecond), timings.rejoined.Round(time.Millisecond),
		load.longest().Round(time.Millisecond))

	// The relay catches up on the new primary.
	caughtUp := time.Now()
	awaitOutboxDrained(t, ctx, pool, 20*time.Second)
	t.Logf("the relay drained the outbox %s after the load ended", time.Since(caughtUp).Round(time.Millisecond))

	// No key below its Postgres version; in fact every key equal.
	c := cache.New(rdb, cache.Options{Prefix: prefix})
	rows, err := pool.Query(ctx, `SELECT key, status, version FROM idempotency_keys ORDER BY key`)
	require.NoError(t, err)
	type pgKey struct {
		key, status string
		version     int64
	}
	pgKeys, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (pgKey, error) {
		var k pgKey
		err := r.Scan(&k.key, &k.status, &k.version)
		return k, err
	})
	require.NoError(t, err)
	require.Len(t, pgKeys, len(keys))
	for _, k := range pgKeys {
		require.Equal(t, "completed", k.status, "no lost completion: %s", k.key)
		e, found, err := c.Read(ctx, keystate.Ref{Scope: "m", Key: k.key})
		require.NoError(t, err)
		if !found || e.Version < k.version {
			t.Errorf("%s: Redis %s v%d (found %v) below Postgres %s v%d", k.key, e.State, e.Version, found, k.status, k.version)
		}
	}
	oncetest.RequireConverged(t, ctx, pool, c, "%")
	// The reconciler, on REDIS_SENTINEL_URL too, finds every key in sync.
	reconciler := exec.CommandContext(ctx, oncetest.BuildBinary(t, root+"/cmd/reconciler"), "--once", "--dry-run")
	reconciler.Env = append(os.Environ(), "DATABASE_URL="+dbURL, "REDIS_SENTINEL_URL="+g.URL(), "REDIS_PREFIX="+prefix)
	out, err := reconciler.Output()
	require.NoError(t, err, "reconciler --once")
	var pass struct {
		Scanned int `json:"scanned"`
		InSync  int `json:"in_sync"`
	}
	require.NoError(t, json.Unmarshal(out, &pass), string(out))
	require.Equal(t, len(keys), pass.Scanned, string(out))
	require.Equal(t, len(keys), pass.InSync, string(out))

	// I1, I3, I4.
	counts := map[string]int{}
	rows, err = pool.Query(ctx, `SELECT idempotency_key, count(*) FROM payments GROUP BY 1`)
	require.NoError(t, err)
	for rows.Next() {
		var key string
		var n int
		require.NoError(t, rows.Scan(&key, &n))
		counts[key] = n
	}
	require.NoError(t, rows.Err())
	for _, key := range keys {
		require.Equal(t, 1, counts[key], "I1: %s ran %d times", key, counts[key])
	}
	require.Len(t, counts, len(keys), "no payment without a key")
	require.Zero(t, load.overlaps(), "I4: executions of one key overlapped")
	// I3 after the failover too, whether or not the load happened to reuse
	// a key while it ran.
	before := load.reusedRefused()
	for _, key := range keys[:5] {
		load.send(ctx, key, true)
	}
	require.Equal(t, before+5, load.reusedRefused(), "I3: a reused key is refused after the failover")

	// I2, and the engine follows: after the failover every replay is
	// served by the new primary, byte for byte the first answer.
	fromCache := requests(t, reg, "replayed_cache")
	for _, key := range keys {
		answers := load.answersOf(key)
		require.NotEmpty(t, answers, key)
		for _, a := range answers[1:] {
			require.Equal(t, answers[0], a, "I2: %s answered twice differently", key)
		}
		out, err := engine.Do(ctx, "m", key, []byte("p"), load.handler(key))
		require.NoError(t, err)
		require.True(t, out.Replayed, key)
		require.Equal(t, answers[0], out.Result, "I2: %s replays its first answer", key)
	}
	require.InDelta(t, float64(len(keys)), requests(t, reg, "replayed_cache")-fromCache, 0,
		"every replay after the failover came from Redis")

	// The relay daemon still answers ready on the new primary.
	res, err := http.Get("http://" + relayd.Addr + "/readyz") //nolint:noctx // a test probe
	require.NoError(t, err)
	require.NoError(t, res.Body.Close())
	require.Equal(t, http.StatusOK, res.StatusCode, relayd.Logs.String())
}

// failoverTimings are the durations failover measured.
type failoverTimings struct {
	promoted, clientFollowed, rejoined time.Duration
}

// failover cuts the replica off for 700ms (frozen, its link dropped: writes
// the primary acknowledges meanwhile never reach it), kills the primary
// (SIGKILL), thaws the replica, waits for Sentinel to promote it and for the failover client rdb
// to write to it, then restarts the old primary, empty, and waits until
// Sentinel has made it a replica in sync.
func failover(t *testing.T, ctx context.Context, g *oncetest.SentinelGroup, rdb *redis.Client, prefix string) failoverTimings {
	t.Helper()
	old, err := g.Master(ctx)
	require.NoError(t, err)
	replica := g.Servers[0]
	if replica == old {
		replica = g.Servers[1]
	}
	// A frozen replica still takes the replication stream into its socket
	// buffer, and would apply it after the thaw: the primary drops the
	// link too, and the frozen replica cannot reconnect.
	replica.Freeze()
	require.NoError(t, old.Client(t).ClientKillByFilter(ctx, "TYPE", "replica").Err())
	time.Sleep(700 * time.Millisecond) // the replica's time cut off, while the primary acknowledges writes it never gets
	killed := time.Now()
	old.Stop()
	replica.Thaw()

	var tm failoverTimings
	promoted := g.WaitFailover(old, 30*time.Second)
	require.Equal(t, replica, promoted)
	tm.promoted = time.Since(killed)
	probe := prefix + "failover-probe"
	direct := promoted.Client(t)
	oncetest.Eventually(t, 20*time.Second, "the failover client writes to the new primary", func() bool {
		return rdb.Set(ctx, probe, "x", time.Minute).Err() == nil && direct.Exists(ctx, probe).Val() == 1
	})
	tm.clientFollowed = time.Since(killed)

	restarted := time.Now()
	old.Start()
	g.WaitHealthy(30 * time.Second)
	tm.rejoined = time.Since(restarted)
	return tm
}

// failoverLoad sends requests through an engine and records what happens.
type failoverLoad struct {
	engine *onceonly.Engine

	mu       sync.Mutex
	answers  map[string][]onceonly.Result
	running  map[string]int
	overlap  int
	refused  int
	failures []string
	// longestWait is the longest a request kept answering "in flight".
	longestWait time.Duration
}

func newFailoverLoad(engine *onceonly.Engine) *failoverLoad {
	return &failoverLoad{engine: engine, answers: map[string][]onceonly.Result{}, running: map[string]int{}}
}

// handler records one payment for key, taking 20–120ms (so executions span
// the failover), and notes any execution of key that overlaps another.
func (l *failoverLoad) handler(key string) onceonly.Handler {
	return func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
		l.mu.Lock()
		l.running[key]++
		if l.running[key] > 1 {
			l.overlap++
		}
		l.mu.Unlock()
		defer func() {
			l.mu.Lock()
			l.running[key]--
			l.mu.Unlock()
		}()
		time.Sleep(time.Duration(20+rand.IntN(100)) * time.Millisecond) // the execution's length, so executions span the failover
		var id string
		if err := tx.QueryRow(ctx, `INSERT INTO payments (id, merchant_id, idempotency_key, amount, currency, customer, status)
			VALUES (gen_random_uuid()::text, 'm', $1, 100, 'usd', 'c', 'succeeded') RETURNING id`, key).Scan(&id); err != nil {
			return onceonly.Result{}, err
		}
		return onceonly.Result{Status: 201, ContentType: "application/json", Body: []byte(`{"id":"` + id + `"}`)}, nil
	}
}

// inFlightLimit is how long a request may keep answering "in flight": an
// execution takes at most 120ms, so anything longer is a completed key
// that Redis shows at an older version (for up to its 30s lease without
// the relay's guard), less the few seconds the failover itself takes.
const inFlightLimit = 12 * time.Second

// send sends one request for key, retrying "in flight" as a client would,
// and records the answer. With reuse it sends another payload for a key
// that has an answer, which must be refused.
func (l *failoverLoad) send(ctx context.Context, key string, reuse bool) {
	payload := []byte("p")
	if reuse {
		payload = []byte("other")
	}
	began := time.Now()
	for {
		out, err := l.engine.Do(ctx, "m", key, payload, l.handler(key))
		if _, inFlight := onceonly.IsInFlight(err); inFlight && time.Since(began) < inFlightLimit {
			time.Sleep(20 * time.Millisecond) // a client's pause before it retries, not a wait for an event
			continue
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		l.longestWait = max(l.longestWait, time.Since(began))
		switch {
		case reuse && errors.Is(err, onceonly.ErrKeyReused):
			l.refused++
		case reuse:
			l.failures = append(l.failures, fmt.Sprintf("%s with another payload: %v (replayed %v)", key, err, out.Replayed))
		case err != nil:
			l.failures = append(l.failures, fmt.Sprintf("%s: %v after %s", key, err, time.Since(began).Round(time.Millisecond)))
		default:
			l.answers[key] = append(l.answers[key], out.Result)
		}
		return
	}
}

// run sends every key three times, shuffled, from 16 workers, and once
// answered keys again with another payload now and then; disrupt starts a
// quarter into the load, and the load goes on, sending answered keys again,
// until it is over.
func (l *failoverLoad) run(t *testing.T, ctx context.Context, keys []string, disrupt func()) {
	t.Helper()
	type job struct {
		key   string
		reuse bool
	}
	jobs := make([]job, 0, 3*len(keys))
	for _, k := range keys {
		jobs = append(jobs, job{key: k}, job{key: k}, job{key: k})
	}
	rand.Shuffle(len(jobs), func(i, j int) { jobs[i], jobs[j] = jobs[j], jobs[i] })
	queue := make(chan job)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for j := range queue {
				if j.reuse && len(l.answersOf(j.key)) == 0 {
					j.reuse = false // no answer yet: it would be the first execution
				}
				l.send(ctx, j.key, j.reuse)
			}
		})
	}
	disrupted := make(chan struct{})
	for i, j := range jobs {
		if i == len(jobs)/4 {
			go func() {
				defer close(disrupted)
				disrupt()
			}()
		}
		queue <- j
	}
	for over := false; !over; {
		select {
		case <-disrupted:
			over = true
		case queue <- job{key: keys[rand.IntN(len(keys))], reuse: rand.IntN(8) == 0}:
		}
	}
	close(queue)
	wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, f := range l.failures {
		t.Error(f)
	}
}

func (l *failoverLoad) answersOf(key string) []onceonly.Result {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]onceonly.Result(nil), l.answers[key]...)
}

func (l *failoverLoad) longest() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.longestWait
}

func (l *failoverLoad) overlaps() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.overlap
}

func (l *failoverLoad) reusedRefused() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.refused
}

// requests returns the engine's count of requests with outcome.
func requests(t *testing.T, reg *prometheus.Registry, outcome string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "onceonly_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "outcome" && lp.GetValue() == outcome {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
