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
	"github.com/onceonly/onceonly/oncetest"
)

// TestAutoPipelineHammer sends reads of many keys from many goroutines at
// once, some under contexts that end while they wait: every command that
// returns without error has its own key's value (never another caller's
// reply), and concurrent commands shared round trips (but on a cluster,
// where each goes on its own).
func TestAutoPipelineHammer(t *testing.T) {
	t.Parallel()
	oncetest.OnEachRedis(t, hammerPipeline)
	t.Run("sentinel", func(t *testing.T) {
		t.Parallel()
		hammerPipeline(t, oncetest.SentinelClient(t, oncetest.SentinelURL(t)))
	})
}

// hammerPipeline is TestAutoPipelineHammer on rdb.
func hammerPipeline(t *testing.T, rdb redis.UniversalClient) {
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
	if _, cluster := rdb.(*redis.ClusterClient); cluster {
		require.Zero(t, roundTrips, "a cluster client sends each command on its own")
		return
	}
	require.LessOrEqual(t, commands, int64(callers*each))
	require.GreaterOrEqual(t, commands, int64(callers*each-cancelled))
	require.Less(t, roundTrips, commands/2, "concurrent commands should share round trips")
}

// TestNoAutoPipeline: with the option, every command makes its own round
// trip.
func TestNoAutoPipeline(t *testing.T) {
	t.Parallel()
	rdb, _ := oncetest.Redis(t)
	ctx := oncetest.Context(t)
	c := cache.New(rdb, cache.Options{Prefix: oncetest.KeyPrefix(t, rdb), NoAutoPipeline: true})
	cmd := redis.NewStringCmd(ctx, "getrange", c.Prefix()+"absent", 0, -1)
	require.NoError(t, cache.Do(ctx, c, cmd))
	require.Empty(t, cmd.Val())
	roundTrips, commands := cache.PipelineStats(c)
	require.Zero(t, roundTrips)
	require.Zero(t, commands)
}

// panicky is a client hook that panics on any command naming the key boom,
// alone or in a pipeline, as a faulty instrumentation hook might.
type panicky struct{ boom string }

func (h panicky) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h panicky) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.check(cmd)
		return next(ctx, cmd)
	}
}

func (h panicky) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h.check(cmd)
		}
		return next(ctx, cmds)
	}
}

func (h panicky) check(cmd redis.Cmder) {
	if len(cmd.Args()) > 1 && cmd.Args()[1] == h.boom {
		panic("boom")
	}
}

// TestAutoPipelineSurvivesAPanic: a round trip that panics (in a hook)
// fails the commands it carried, and the commands that waited behind it
// are still sent: no caller hangs, no reply goes to another caller.
func TestAutoPipelineSurvivesAPanic(t *testing.T) {
	t.Parallel()
	rdb, prefix := oncetest.Redis(t)
	rdb.AddHook(panicky{boom: prefix + "boom"})
	c := cache.New(rdb, cache.Options{Prefix: prefix})
	ctx := oncetest.Context(t)
	require.NoError(t, rdb.Set(ctx, prefix+"k", "v", time.Minute).Err())

	var wg sync.WaitGroup
	var mu sync.Mutex
	panics, failed := 0, 0
	for range 32 {
		wg.Go(func() {
			for range 100 {
				key := prefix + "k"
				if rand.IntN(10) == 0 {
					key = prefix + "boom"
				}
				cmd := redis.NewStringCmd(ctx, "getrange", key, 0, -1)
				func() {
					defer func() {
						if recover() != nil {
							mu.Lock()
							panics++
							mu.Unlock()
						}
					}()
					if err := cache.Do(ctx, c, cmd); err != nil {
						mu.Lock()
						failed++
						mu.Unlock()
						return
					}
					if key == prefix+"k" && cmd.Val() != "v" {
						t.Errorf("got %q, want v", cmd.Val())
					}
				}()
			}
		})
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(30 * time.Second):
		t.Fatal("callers still wait after a round trip panicked")
	}
	t.Logf("%d panics, %d commands failed with them", panics, failed)
	require.Positive(t, panics)
}
