package cache_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/internal/testenv"
)

// TestAutoPipelineHammer sends reads of many keys from many goroutines at
// once, some under contexts that end while they wait: every command that
// returns without error has its own key's value (never another caller's
// reply), and concurrent commands shared round trips.
func TestAutoPipelineHammer(t *testing.T) {
	t.Parallel()
	testenv.OnEachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		b := setup(t, rdb)
		const keys, callers, each = 64, 32, 200
		name := func(i int) string { return fmt.Sprintf("%spipe:%d", b.cache.Prefix(), i) }
		for i := range keys {
			require.NoError(t, rdb.Set(b.ctx, name(i), fmt.Sprintf("value %d", i), time.Minute).Err())
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		cancelled := 0
		for range callers {
			wg.Go(func() {
				for range each {
					i := rand.IntN(keys)
					ctx, cancel := b.ctx, context.CancelFunc(func() {})
					if rand.IntN(8) == 0 { // ends while waiting, or sooner
						ctx, cancel = context.WithTimeout(b.ctx, time.Duration(rand.IntN(200))*time.Microsecond)
					}
					cmd := redis.NewStringCmd(ctx, "getrange", name(i), 0, -1)
					err := cache.Do(ctx, b.cache, cmd)
					cancel()
					if err != nil {
						if ctx.Err() == nil {
							t.Errorf("key %d: %v", i, err)
						}
						mu.Lock()
						cancelled++
						mu.Unlock()
						continue
					}
					if got, want := cmd.Val(), fmt.Sprintf("value %d", i); got != want {
						t.Errorf("key %d got %q, want %q", i, got, want)
					}
				}
			})
		}
		wg.Wait()
		roundTrips, commands := cache.PipelineStats(b.cache)
		t.Logf("%d commands (%d given up) in %d round trips", callers*each, cancelled, roundTrips)
		require.LessOrEqual(t, commands, int64(callers*each))
		require.GreaterOrEqual(t, commands, int64(callers*each-cancelled))
		require.Less(t, roundTrips, commands/2, "concurrent commands should share round trips")
	})
}

// TestNoAutoPipeline: with the option, every command makes its own round
// trip.
func TestNoAutoPipeline(t *testing.T) {
	t.Parallel()
	rdb, _ := testenv.Redis(t)
	ctx := testenv.Context(t)
	c := cache.New(rdb, cache.Options{Prefix: testenv.KeyPrefix(t, rdb), NoAutoPipeline: true})
	cmd := redis.NewStringCmd(ctx, "getrange", c.Prefix()+"absent", 0, -1)
	require.NoError(t, cache.Do(ctx, c, cmd))
	require.Empty(t, cmd.Val())
	roundTrips, commands := cache.PipelineStats(c)
	require.Zero(t, roundTrips)
	require.Zero(t, commands)
}
