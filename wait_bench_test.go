package onceonly

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/oncetest"
)

// BenchmarkWait measures what MiddlewareOptions.Wait costs, side by side:
//
//   - replay: a duplicate of a settled key, answered from Redis (the floor);
//
//   - await-settled: the same duplicate through await, which watches the
//     key first: the subscription's own connection, SSUBSCRIBE and close;
//
//   - woken: a duplicate that waits while the first execution runs and is
//     woken by its completion (per op: one first execution plus one waiter).
//
//     go test -run '^$' -bench Wait -benchtime 2000x .
func BenchmarkWait(b *testing.B) {
	ctx := oncetest.Context(b)
	rdb, prefix := oncetest.Redis(b)
	e, err := New(Config{Pool: oncetest.DB(b), Redis: rdb, RedisPrefix: prefix, Logger: oncetest.QuietLogger()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(e.Close)
	ok := func(_ context.Context, tx pgx.Tx) (Result, error) {
		_, err := tx.Exec(ctx, "SELECT 1")
		return Result{Status: 200, Body: []byte(`{}`)}, err
	}
	ask := func(key string) func(ctx context.Context) (Outcome, error) {
		return func(ctx context.Context) (Outcome, error) { return e.Do(ctx, "bench", key, nil, ok) }
	}
	if _, err := e.Do(ctx, "bench", "settled", nil, ok); err != nil {
		b.Fatal(err)
	}
	settled := keystate.Ref{Scope: "bench", Key: "settled"}
	b.Run("replay", func(b *testing.B) {
		for range b.N {
			if out, err := ask("settled")(ctx); err != nil || !out.Replayed {
				b.Fatal(out, err)
			}
		}
	})
	b.Run("await-settled", func(b *testing.B) {
		for range b.N {
			if out, err := e.await(ctx, settled, time.Second, ask("settled")); err != nil || !out.Replayed {
				b.Fatal(out, err)
			}
		}
	})
	b.Run("woken", func(b *testing.B) {
		run := oncetest.RandomSuffix(8)
		for i := range b.N {
			key := run + "-" + strconv.Itoa(i)
			release, claimed := make(chan struct{}), make(chan struct{})
			var wg sync.WaitGroup
			wg.Go(func() {
				_, _ = e.Do(ctx, "bench", key, nil, func(context.Context, pgx.Tx) (Result, error) {
					close(claimed)
					<-release
					return Result{Status: 200, Body: []byte(`{}`)}, nil
				})
			})
			<-claimed
			var out Outcome
			ref := keystate.Ref{Scope: "bench", Key: key}
			wg.Go(func() { out, err = e.await(ctx, ref, 5*time.Second, ask(key)) })
			awaitSubscriber(b, ctx, rdb, cache.KeyName(prefix, ref))
			close(release)
			wg.Wait()
			if err != nil || !out.Replayed {
				b.Fatal(out, err)
			}
		}
	})
}

// awaitSubscriber waits until a client watches name (SSUBSCRIBE, as
// Cache.Watch does), asking Redis again at once: a pause between asks
// would count in the benchmark's time.
func awaitSubscriber(b *testing.B, ctx context.Context, rdb redis.UniversalClient, name string) {
	b.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; {
		n, err := rdb.PubSubShardNumSub(ctx, name).Result()
		if err != nil {
			b.Fatal(err)
		}
		if n[name] > 0 {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("nobody watches %s after 5s", name)
		}
	}
}
