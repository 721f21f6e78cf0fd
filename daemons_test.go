package onceonly_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/oncetest"
)

// TestStartRunsTheDaemons: one call runs the relay (the outbox drains
// without any other process), the reconciler (a Redis key deleted behind
// the engine's back comes back on the next pass) and the resumer (a
// handed-off execution of a registered handler is finished with no call
// retried), from the engine's own settings; Stop stops them, and Close
// after Stop is safe.
func TestStartRunsTheDaemons(t *testing.T) {
	ctx := oncetest.Context(t)
	pool := oncetest.DB(t)
	rdb, prefix := oncetest.Redis(t)
	engine, err := onceonly.New(onceonly.Config{
		Pool: pool, Redis: rdb, RedisPrefix: prefix, LeaseTimeout: time.Second,
		ResumeInterval: 100 * time.Millisecond, Registerer: prometheus.NewRegistry(),
		Daemons: onceonly.Daemons{ReconcileSchedule: "@every 1s", ReapGrace: 100 * time.Millisecond},
	})
	require.NoError(t, err)
	t.Cleanup(engine.Close)

	// The resumer's case, set up before Start: a step whose outcome is
	// unknown hands the key off; the resumer runs the handler again.
	var runs atomic.Int32
	require.NoError(t, engine.Register("charge", func(ctx context.Context, x *onceonly.Execution) (onceonly.Result, error) {
		run := runs.Add(1)
		if _, err := onceonly.Step(ctx, "call", func(context.Context, string) (int, error) {
			if run == 1 {
				return 0, errors.New("outcome unknown")
			}
			return 1, nil
		}); err != nil {
			return onceonly.Result{}, err
		}
		return onceonly.Result{Status: 201}, nil
	}))
	_, err = engine.Run(ctx, "charge", "acct_1", "handed-off", []byte(`{}`))
	var handedOff *onceonly.ExecutionError
	require.ErrorAs(t, err, &handedOff)
	require.True(t, handedOff.HandedOff, "the step's outcome is unknown: the key is handed off")

	require.NoError(t, engine.Start(ctx))
	require.NoError(t, engine.Start(ctx), "a second Start does nothing")

	_, err = engine.Do(ctx, "acct_1", "k1", []byte(`{}`), func(context.Context, pgx.Tx) (onceonly.Result, error) {
		return onceonly.Result{Status: 200, Body: []byte("ok")}, nil
	})
	require.NoError(t, err)
	oncetest.Eventually(t, 10*time.Second, "the relay drained the outbox", func() bool {
		var n int
		return pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n) == nil && n == 0
	})

	require.NoError(t, rdb.Del(ctx, prefix+"acct_1:k1").Err())
	oncetest.Eventually(t, 10*time.Second, "the reconciler repaired the deleted Redis key", func() bool {
		n, err := rdb.Exists(ctx, prefix+"acct_1:k1").Result()
		return err == nil && n == 1
	})

	oncetest.Eventually(t, 10*time.Second, "the resumer finished the handed-off execution", func() bool {
		var status string
		err := pool.QueryRow(ctx, `SELECT status FROM idempotency_keys WHERE scope = 'acct_1' AND key = 'handed-off'`).Scan(&status)
		return err == nil && status == "completed"
	})

	require.NoError(t, engine.Stop(ctx))
	require.NoError(t, engine.Stop(ctx), "Stop twice is safe")
}

// TestStartWithoutRedis: the relay and the reconciler need Redis; the
// resumer alone runs without it.
func TestStartWithoutRedis(t *testing.T) {
	ctx := oncetest.Context(t)
	engine, err := onceonly.New(onceonly.Config{Pool: oncetest.DB(t)})
	require.NoError(t, err)
	t.Cleanup(engine.Close)
	require.ErrorIs(t, engine.Start(ctx), onceonly.ErrNoRedisForDaemons)

	alone, err := onceonly.New(onceonly.Config{Pool: oncetest.DB(t),
		Daemons: onceonly.Daemons{NoRelay: true, NoReconciler: true}})
	require.NoError(t, err)
	t.Cleanup(alone.Close)
	require.NoError(t, alone.Start(ctx))
}

// TestStartAgainAfterItsContextEnded: once the context of the first Start
// has ended (its daemons with it), a second Start runs them anew, and so
// does a Start after Stop (with the same metrics registry): the outbox
// drains each time. After Close, Start refuses with ErrClosed rather than
// start daemons nothing would stop.
func TestStartAgainAfterItsContextEnded(t *testing.T) {
	t.Parallel()
	ctx := oncetest.Context(t)
	pool := oncetest.DB(t)
	rdb, prefix := oncetest.Redis(t)
	engine, err := onceonly.New(onceonly.Config{
		Pool: pool, Redis: rdb, RedisPrefix: prefix, Registerer: prometheus.NewRegistry(),
		Daemons: onceonly.Daemons{ReconcileSchedule: "@every 1h"},
	})
	require.NoError(t, err)
	t.Cleanup(engine.Close)
	drained := func(key string) {
		t.Helper()
		_, err := engine.Do(ctx, "acct_1", key, []byte(`{}`), func(context.Context, pgx.Tx) (onceonly.Result, error) {
			return onceonly.Result{Status: 200, Body: []byte("ok")}, nil
		})
		require.NoError(t, err)
		oncetest.Eventually(t, 10*time.Second, "the relay drained the outbox after "+key, func() bool {
			var n int
			return pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n) == nil && n == 0
		})
	}

	first, cancel := context.WithCancel(ctx)
	require.NoError(t, engine.Start(first))
	cancel()
	require.NoError(t, engine.Start(ctx), "the first Start's context ended: Start again")
	drained("after-context")

	require.NoError(t, engine.Stop(ctx))
	require.NoError(t, engine.Start(ctx), "Start after Stop")
	drained("after-stop")

	engine.Close()
	require.ErrorIs(t, engine.Start(ctx), onceonly.ErrClosed)
	require.NoError(t, engine.Stop(ctx), "Stop after Close is safe")
}
