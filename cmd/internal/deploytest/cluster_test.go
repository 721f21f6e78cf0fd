package deploytest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/oncetest"
	"github.com/onceonly/onceonly/reconcile"
	"github.com/onceonly/onceonly/relay"
)

// TestClusterTopologyChangesUnderTraffic runs retried requests, with a relay
// delivering, while the cluster changes under them: first a slot holding
// 150 live keys migrates to another master (clients follow ASK and MOVED
// redirections mid-write), then a master restarts empty. Afterwards every
// key has run once (I1), every copy of a request got the same answer and a
// later replay still does (I2), and Redis equals Postgres: after the slot
// move once the relay has caught up, after the restart once the reconciler
// has made one pass (I7).
func TestClusterTopologyChangesUnderTraffic(t *testing.T) {
	t.Parallel()
	cluster := oncetest.NewRedisCluster(t)
	rdb := cluster.Client(t)
	ctx, pool, prefix := oncetest.Context(t), oncetest.DB(t), oncetest.KeyPrefix(t, rdb)
	engine, err := onceonly.New(onceonly.Config{Pool: pool, Redis: rdb, RedisPrefix: prefix, LeaseTimeout: 5 * time.Second,
		MaxCachedBody: 1024, Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	t.Cleanup(engine.Close)
	c := cache.New(rdb, cache.Options{Prefix: prefix, MaxBody: 1024})
	rl, err := relay.New(relay.Config{Pool: pool, Redis: rdb, RedisPrefix: prefix, MaxCachedBody: 1024, PollInterval: 50 * time.Millisecond,
		Logger: oncetest.QuietLogger(), Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	relayCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- rl.Run(relayCtx) }()
	t.Cleanup(func() {
		stopRelay()
		require.NoError(t, <-relayDone)
	})
	answers := &answerLog{byKey: map[string][]onceonly.Result{}}

	// Phase 1: a slot full of live keys moves while they are requested.
	// The hash tag puts every {hot} key in one slot.
	keys := make([]string, 0, 300)
	for i := range 150 {
		keys = append(keys, fmt.Sprintf("{hot}-%d", i))
	}
	for i := range 150 {
		keys = append(keys, fmt.Sprintf("plain-%d", i))
	}
	slot, err := rdb.ClusterKeySlot(ctx, c.Key(keystate.Ref{Scope: "m", Key: keys[0]})).Result()
	require.NoError(t, err)
	from, err := cluster.Owner(ctx, int(slot))
	require.NoError(t, err)
	to := cluster.Nodes[0]
	if to == from {
		to = cluster.Nodes[1]
	}
	sendEach(t, ctx, engine, keys, answers, func() {
		require.NoError(t, cluster.MoveSlot(ctx, int(slot), to))
	})
	owner, err := cluster.Owner(ctx, int(slot))
	require.NoError(t, err)
	require.Equal(t, to.Addr(), owner.Addr(), "the slot moved")
	awaitOutboxDrained(t, ctx, pool, 20*time.Second)
	oncetest.RequireConverged(t, ctx, pool, c, "%")

	// Phase 2: a master restarts empty while requests run.
	more := make([]string, 0, 300)
	for i := range 300 {
		more = append(more, fmt.Sprintf("restart-%d", i))
	}
	sendEach(t, ctx, engine, more, answers, func() {
		cluster.Nodes[2].Restart()
		cluster.WaitHealthy()
	})
	awaitOutboxDrained(t, ctx, pool, 20*time.Second)
	rc, err := reconcile.New(reconcile.Config{Pool: pool, Redis: rdb, RedisPrefix: prefix, MaxCachedBody: 1024, FailedTTL: time.Minute,
		Logger: oncetest.QuietLogger(), Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	_, err = rc.Pass(ctx, false)
	require.NoError(t, err)
	oncetest.RequireConverged(t, ctx, pool, c, "%")
	again, err := rc.Pass(ctx, false)
	require.NoError(t, err)
	require.Zero(t, again.Drift(), "a second pass finds nothing: %+v", again)

	// I1 and I2.
	all := slices.Concat(keys, more)
	rows := map[string]int{}
	r, err := pool.Query(ctx, `SELECT idempotency_key, count(*) FROM payments GROUP BY 1`)
	require.NoError(t, err)
	for r.Next() {
		var key string
		var n int
		require.NoError(t, r.Scan(&key, &n))
		rows[key] = n
	}
	require.NoError(t, r.Err())
	for _, key := range all {
		require.Equal(t, 1, rows[key], "I1: %s ran %d times", key, rows[key])
		got := answers.byKey[key]
		require.NotEmpty(t, got)
		for _, res := range got[1:] {
			require.Equal(t, got[0], res, "I2: %s answered twice differently", key)
		}
		out, err := engine.Do(ctx, "m", key, []byte("p"), keyedPayment(key))
		require.NoError(t, err)
		require.True(t, out.Replayed, key)
		require.Equal(t, got[0], out.Result, "I2: %s replays its first answer", key)
	}
	require.Len(t, rows, len(all), "no payment without a key")
}

// answerLog records every answer per key.
type answerLog struct {
	mu    sync.Mutex
	byKey map[string][]onceonly.Result
}

func (l *answerLog) add(key string, r onceonly.Result) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.byKey[key] = append(l.byKey[key], r)
}

// keyedPayment records one payment for key per execution and answers with
// a body that differs between executions.
func keyedPayment(key string) onceonly.Handler {
	return func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
		var id string
		if err := tx.QueryRow(ctx, `INSERT INTO payments (id, merchant_id, idempotency_key, amount, currency, customer, status)
			VALUES (gen_random_uuid()::text, 'm', $1, 100, 'usd', 'c', 'succeeded') RETURNING id`, key).Scan(&id); err != nil {
			return onceonly.Result{}, err
		}
		return onceonly.Result{Status: 201, ContentType: "application/json", Body: []byte(`{"id":"` + id + `"}`)}, nil
	}
}

// sendEach sends every key three times through engine, shuffled, from 16
// workers, retrying in-flight answers as a client would, and runs disrupt
// once the load is under way. It returns when every request has its answer.
func sendEach(t *testing.T, ctx context.Context, engine *onceonly.Engine, keys []string, answers *answerLog, disrupt func()) {
	t.Helper()
	jobs := make([]string, 0, 3*len(keys))
	for _, k := range keys {
		jobs = append(jobs, k, k, k)
	}
	rand.Shuffle(len(jobs), func(i, j int) { jobs[i], jobs[j] = jobs[j], jobs[i] })
	queue := make(chan string)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Go(func() {
			for key := range queue {
				for {
					out, err := engine.Do(ctx, "m", key, []byte("p"), keyedPayment(key))
					if _, inFlight := onceonly.IsInFlight(err); inFlight {
						time.Sleep(5 * time.Millisecond) // a client's pause before it retries, not a wait for an event
						continue
					}
					if err != nil {
						errs <- fmt.Errorf("%s: %w", key, err)
						return
					}
					answers.add(key, out.Result)
					break
				}
			}
		})
	}
	// The disruption starts a quarter into the load, and the load goes on,
	// sending keys again, until the disruption is over.
	disrupted := make(chan struct{})
	for i, k := range jobs {
		if i == len(jobs)/4 {
			go func() {
				defer close(disrupted)
				disrupt()
			}()
		}
		queue <- k
	}
	for over := false; !over; {
		select {
		case <-disrupted:
			over = true
		case queue <- keys[rand.IntN(len(keys))]:
		}
	}
	close(queue)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
