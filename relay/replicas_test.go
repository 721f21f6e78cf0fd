package relay

import (
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/oncetest"
)

// TestWaitReplicasKeepsEventsTheReplicaLacks: with WaitReplicas, a batch
// the primary applied while its replica was frozen (so a failover right then
// would lose it) stays in the outbox, even when every apply was a no-op
// because the engine's write-through, on another connection, got there
// first; once the replica has caught up the next drain deletes the events,
// and the replica holds every key.
func TestWaitReplicasKeepsEventsTheReplicaLacks(t *testing.T) {
	t.Parallel()
	g := oncetest.NewSentinelGroup(t)
	rdb := g.Client(t)
	b := setup(t, oncetest.OnRedis(rdb))
	reg := prometheus.NewRegistry()
	r := b.relay(t, Config{WaitReplicas: 1, WaitTimeout: 200 * time.Millisecond, Registerer: reg})
	replica := g.Servers[1]

	// The keys reach the primary through a write-through (an api's client)
	// while the replica is frozen: the relay's own applies then change
	// nothing.
	api := cache.New(g.Client(t), cache.Options{Prefix: b.Cache.Prefix()})
	const keys = 20
	b.CompleteKeys(t, "s", "k", keys)
	events := b.outboxLen(t)
	replica.Freeze()
	thawed := false
	defer func() {
		if !thawed {
			replica.Thaw()
		}
	}()
	for i := range keys {
		k, found, err := b.Store.Get(b.Ctx, b.Pool, keystate.Ref{Scope: "s", Key: "k" + strconv.Itoa(i)})
		require.NoError(t, err)
		require.True(t, found)
		applied, err := api.Apply(b.Ctx, k)
		require.NoError(t, err)
		require.True(t, applied)
	}
	began := time.Now()
	n, err := r.Drain(b.Ctx)
	require.ErrorIs(t, err, ErrReplicasBehind)
	require.Zero(t, n)
	require.GreaterOrEqual(t, time.Since(began), 200*time.Millisecond, "the batch waited WaitTimeout")
	require.Equal(t, events, b.outboxLen(t), "no event left while the replica lacked its write")
	require.InDelta(t, 1, testutil.ToFloat64(r.metrics.errors.WithLabelValues(stageReplicas)), 0)

	replica.Thaw()
	thawed = true
	n, err = r.Drain(b.Ctx)
	require.NoError(t, err)
	require.Equal(t, events, n)
	require.Zero(t, b.outboxLen(t))
	onReplica := cache.New(replica.Client(t), cache.Options{Prefix: b.Cache.Prefix()})
	for i := range keys {
		e, found, err := onReplica.Read(b.Ctx, keystate.Ref{Scope: "s", Key: "k" + strconv.Itoa(i)})
		require.NoError(t, err)
		require.True(t, found, "k%d on the replica", i)
		require.Equal(t, keystate.Completed, e.State)
	}
}

// TestWaitReplicasNeedsOnePrimary: a cluster has a primary per shard, which
// one WAIT cannot cover; the relay refuses the setting.
func TestWaitReplicasNeedsOnePrimary(t *testing.T) {
	t.Parallel()
	rdb := oncetest.RedisClusterClient(t)
	_, err := New(Config{Pool: oncetest.DB(t), Redis: rdb, WaitReplicas: 1})
	require.ErrorContains(t, err, "not a cluster")
}
