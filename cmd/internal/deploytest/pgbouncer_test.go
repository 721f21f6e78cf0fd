package deploytest

import (
	"context"
	"errors"
	"io/fs"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/demo/gateway"
	"github.com/onceonly/onceonly/demo/payments/schema"
	"github.com/onceonly/onceonly/migrations"
	"github.com/onceonly/onceonly/oncetest"
	"github.com/onceonly/onceonly/reconcile"
	"github.com/onceonly/onceonly/relay"
)

// TestThroughPgBouncer runs the whole life of a deployment with every
// connection going through a real PgBouncer in transaction mode, in both
// query modes that allow it: two migrators racing on an empty database,
// the gateway's migrations, the engine's first executions, replays,
// failures, reused keys and steps, consecutive reconciler passes (none
// skipped), and a relay that polls (no LISTEN) draining the outbox.
func TestThroughPgBouncer(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			ctx := oncetest.Context(t)
			pool := oncetest.Pool(t, oncetest.PgBouncerURL(t, oncetest.EmptyDatabaseURL(t), mode))

			// Migrations: two migrators at once share the work under goose's
			// table lock; the gateway's go beside them.
			files, err := fs.Glob(migrations.FS(), "*.sql")
			require.NoError(t, err)
			var wg sync.WaitGroup
			applied, errs := make([]int, 2), make([]error, 2)
			for i := range applied {
				wg.Go(func() {
					m, err := migrations.NewMigrator(pool)
					if err != nil {
						errs[i] = err
						return
					}
					defer m.Close()
					applied[i], errs[i] = m.Up(ctx)
				})
			}
			wg.Wait()
			require.NoError(t, errors.Join(errs...))
			require.Equal(t, len(files), applied[0]+applied[1], "every migration ran once")
			require.NoError(t, migrations.EnsureCurrent(ctx, pool))
			demo, err := migrations.NewMigrator(pool, schema.Migrations()) // the payments table
			require.NoError(t, err)
			_, err = demo.Up(ctx)
			require.NoError(t, err)
			require.NoError(t, demo.Close())
			require.NoError(t, gateway.Migrate(ctx, pool))

			rdb, prefix := oncetest.Redis(t)
			e, err := onceonly.New(onceonly.Config{Pool: pool, Redis: rdb, RedisPrefix: prefix,
				MaxCachedBody: 1024, Registerer: prometheus.NewRegistry()})
			require.NoError(t, err)
			t.Cleanup(e.Close)

			// First execution, replays from Redis and from Postgres.
			first, err := e.Do(ctx, "m", "k1", []byte("p"), payment(`{"id":1}`))
			require.NoError(t, err)
			require.False(t, first.Replayed)
			again, err := e.Do(ctx, "m", "k1", []byte("p"), payment(`{"id":2}`))
			require.NoError(t, err)
			require.True(t, again.Replayed)
			require.NoError(t, rdb.Del(ctx, prefix+"m:k1").Err())
			again, err = e.Do(ctx, "m", "k1", []byte("p"), payment(`{"id":3}`))
			require.NoError(t, err)
			require.True(t, again.Replayed)
			require.Equal(t, first.Result, again.Result)
			_, err = e.Do(ctx, "m", "k1", []byte("other"), payment(`{}`))
			require.ErrorIs(t, err, onceonly.ErrKeyReused)

			// A failure is retried; a handler with a step completes.
			_, err = e.Do(ctx, "m", "k2", []byte("p"), func(context.Context, pgx.Tx) (onceonly.Result, error) {
				return onceonly.Result{}, errors.New("boom")
			})
			require.Error(t, err)
			out, err := e.Do(ctx, "m", "k2", []byte("p"), payment(`{}`))
			require.NoError(t, err)
			require.False(t, out.Replayed)
			require.NoError(t, e.Register("charge", func(ctx context.Context, x *onceonly.Execution) (onceonly.Result, error) {
				id, err := onceonly.Step(ctx, "charge", func(context.Context, string) (string, error) { return "ch_1", nil })
				if err != nil {
					return onceonly.Result{}, err
				}
				return onceonly.Result{Status: 201, Body: []byte(`{"charge":"` + id + `"}`)}, nil
			}))
			out, err = e.Run(ctx, "charge", "m", "k3", []byte("p"))
			require.NoError(t, err)
			require.JSONEq(t, `{"charge":"ch_1"}`, string(out.Body))

			// Reconciler passes, one after the other: none is skipped.
			c := cache.New(rdb, cache.Options{Prefix: prefix})
			r, err := reconcile.New(reconcile.Config{Pool: pool, Redis: rdb, RedisPrefix: prefix, Logger: oncetest.QuietLogger(),
				Registerer: prometheus.NewRegistry()})
			require.NoError(t, err)
			for i := range 3 {
				rep, err := r.Pass(ctx, false)
				require.NoError(t, err)
				require.False(t, rep.Skipped, "pass %d", i+1)
				require.EqualValues(t, 3, rep.Scanned)
			}

			// The relay polls: Redis lost everything, the outbox brings it back.
			require.NoError(t, rdb.Del(ctx, prefix+"m:k1", prefix+"m:k2", prefix+"m:k3").Err())
			_, err = pool.Exec(ctx, `INSERT INTO outbox (scope, key, version) SELECT scope, key, version FROM idempotency_keys`)
			require.NoError(t, err)
			rl, err := relay.New(relay.Config{Pool: pool, Redis: rdb, RedisPrefix: prefix, PollInterval: 50 * time.Millisecond,
				Logger: oncetest.QuietLogger(), Registerer: prometheus.NewRegistry()})
			require.NoError(t, err)
			rctx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- rl.Run(rctx) }()
			awaitOutboxDrained(t, ctx, pool, 5*time.Second)
			stop()
			require.NoError(t, <-done)
			oncetest.RequireConverged(t, ctx, pool, c, "%")
		})
	}
}
