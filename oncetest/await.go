package oncetest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/keystate"
)

// pollEvery is how often Poll and Eventually ask again.
const pollEvery = 10 * time.Millisecond

// Poll calls cond every 10ms until it holds or timeout passes, and reports
// whether it held. It never fails the test, so a goroutine other than the
// test's may wait with it; the test's own goroutine uses Eventually.
func Poll(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pollEvery)
	}
	return true
}

// Eventually polls cond every 10ms until it holds, failing the test if
// timeout passes first.
func Eventually(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	if !Poll(timeout, cond) {
		tb.Fatalf("timed out after %s waiting for %s", timeout, what)
	}
}

// AwaitLeaseOver waits until the lease of ref's row in pool ended more
// than grace ago by Postgres's clock, the clock the key store compares
// leases with: a takeover (grace 0) or the reaper (its grace) may then
// take the key. It fails the test after 10s, or if ref has no row.
func AwaitLeaseOver(tb testing.TB, ctx context.Context, pool *pgxpool.Pool, ref keystate.Ref, grace time.Duration) {
	tb.Helper()
	Eventually(tb, 10*time.Second, "the lease of "+ref.Scope+":"+ref.Key+" over in Postgres", func() bool {
		var over bool
		err := pool.QueryRow(ctx, `SELECT lease_expires_at < now() - $3::interval
			FROM idempotency_keys WHERE scope = $1 AND key = $2`, ref.Scope, ref.Key, grace).Scan(&over)
		if err != nil {
			tb.Fatalf("read the lease of %s:%s: %v", ref.Scope, ref.Key, err)
		}
		return over
	})
}

// AwaitCacheLeaseOver waits until ref's value in c holds no live lease by
// the clock of the Redis server that holds it, the clock the cache's
// scripts read: it is gone, not in progress, or in progress with its
// lease deadline passed. It fails the test after 10s.
func AwaitCacheLeaseOver(tb testing.TB, ctx context.Context, c *cache.Cache, ref keystate.Ref) {
	tb.Helper()
	var node redis.Cmdable = c.Client()
	if cluster, ok := c.Client().(*redis.ClusterClient); ok {
		master, err := cluster.MasterForKey(ctx, c.Key(ref))
		if err != nil {
			tb.Fatalf("find the master of %s: %v", c.Key(ref), err)
		}
		node = master
	}
	Eventually(tb, 10*time.Second, "the lease of "+c.Key(ref)+" over in Redis", func() bool {
		e, found, err := c.Read(ctx, ref)
		if err != nil {
			tb.Fatalf("read %s: %v", c.Key(ref), err)
		}
		if !found || e.State != keystate.InProgress {
			return true
		}
		now, err := cache.RedisTimeMs(ctx, node)
		if err != nil {
			tb.Fatalf("%v", err)
		}
		return now > e.LeaseUntilMs
	})
}

// AwaitClaimed waits until Postgres holds key (of any scope) in progress:
// an execution claimed it and is running. It fails the test after 10s.
func AwaitClaimed(tb testing.TB, ctx context.Context, pool *pgxpool.Pool, key string) {
	tb.Helper()
	Eventually(tb, 10*time.Second, key+" claimed", func() bool {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE key = $1 AND status = 'in_progress'`, key).Scan(&n); err != nil {
			tb.Fatalf("read the status of %s: %v", key, err)
		}
		return n > 0
	})
}
