package relay

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceonly/onceonly/oncetest"
)

// The relay benchmarks run on the servers of TEST_DATABASE_URL,
// TEST_REDIS_URL and TEST_REDIS_CLUSTER_URL; bench/relay.sh runs them on durable servers beside the
// redis-benchmark and pgbench baselines. See docs/BENCHMARKS.md.

// benchEnvInt reads a benchmark size from the environment.
func benchEnvInt(b *testing.B, name string, def int) int {
	if v := os.Getenv(name); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			b.Fatalf("%s=%q: %v", name, v, err)
		}
		return n
	}
	return def
}

// seedBacklog writes n completed keys with a 200-byte body and one outbox
// event each.
func seedBacklog(b testing.TB, bd *bundle, n int) {
	b.Helper()
	body := fmt.Sprintf(`{"id":"pay_%0182d"}`, 0)
	if _, err := bd.Pool.Exec(bd.Ctx, `
		INSERT INTO idempotency_keys (scope, key, status, version, fingerprint, response_status, response_body, expires_at)
		SELECT 'bench', 'key-' || i, 'completed', 2, 'v1:' || md5(i::text), 201, convert_to($2, 'UTF8'), now() + interval '1 day'
		FROM generate_series(1, $1) i`, n, body); err != nil {
		b.Fatal(err)
	}
	if _, err := bd.Pool.Exec(bd.Ctx, `INSERT INTO outbox (scope, key, version)
		SELECT 'bench', 'key-' || i, 2 FROM generate_series(1, $1) i`, n); err != nil {
		b.Fatal(err)
	}
	for _, table := range []string{"outbox", "idempotency_keys"} {
		if _, err := bd.Pool.Exec(bd.Ctx, "VACUUM ANALYZE "+table); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDrain measures how fast relays drain a backlog of BENCH_EVENTS
// (default 200k) events, batch BENCH_BATCH (default 500): one relay and two
// side by side (taking batches with SKIP LOCKED), each into a single Redis
// and into a Redis Cluster (TEST_REDIS_CLUSTER_URL, else a private one).
func BenchmarkDrain(b *testing.B) {
	events := benchEnvInt(b, "BENCH_EVENTS", 200_000)
	batch := benchEnvInt(b, "BENCH_BATCH", DefaultBatchSize)
	for _, target := range []string{"single", "cluster"} {
		for _, relays := range []int{1, 2} {
			b.Run(fmt.Sprintf("redis=%s/relays=%d", target, relays), func(b *testing.B) {
				var total time.Duration
				for range b.N {
					b.StopTimer()
					var rdb redis.UniversalClient
					if target == "cluster" {
						rdb = oncetest.RedisClusterClient(b)
					} else {
						rdb = oncetest.RedisClient(b, oncetest.RedisURL(b))
					}
					bd := setup(b, oncetest.OnRedis(rdb))
					seedBacklog(b, bd, events)
					rs := make([]*Relay, relays)
					for i := range rs {
						rs[i] = bd.relay(b, Config{BatchSize: batch})
					}
					b.StartTimer()
					began := time.Now()
					n, err := drainAll(bd.Ctx, rs)
					total += time.Since(began)
					if err != nil || n != events {
						b.Fatalf("drained %d of %d: %v", n, events, err)
					}
				}
				b.ReportMetric(float64(events*b.N)/total.Seconds(), "events/s")
			})
		}
	}
}

// drainAll runs Drain on every relay at once and returns how many events
// they published together.
func drainAll(ctx context.Context, rs []*Relay) (int, error) {
	var wg sync.WaitGroup
	counts := make([]int, len(rs))
	errs := make([]error, len(rs))
	for i, r := range rs {
		wg.Go(func() {
			counts[i], errs[i] = r.Drain(ctx)
		})
	}
	wg.Wait()
	n := 0
	for _, c := range counts {
		n += c
	}
	return n, errors.Join(errs...)
}

// BenchmarkLag writes BENCH_RATE (default 1000) transitions per second for
// BENCH_SECONDS (default 10) through the store while a relay runs, and
// reports the commit→Redis lag, for both ways a relay is woken:
//
//   - notify=after-commit, the engine's default (DeferNotify): the claim
//     commits without a NOTIFY and the writer then sends one, coalesced as
//     the engine's waker does. The engine does this only when its own
//     write-through to Redis failed, so this is the lag of the relay
//     delivering what the engine could not; the events whose write-through
//     succeeded are already in Redis and wait for the relay's poll.
//   - notify=in-tx (Config.NotifyInTransaction): the NOTIFY is sent by the
//     claim's own commit.
//
// Beside the lag's p50, p99, p99.9 and max it reports the p50 and p99 of its
// parts: wait (created_at until the take is sent: the commit, the NOTIFY,
// waking a worker), take (the take's round trip) and push (Redis).
func BenchmarkLag(b *testing.B) {
	rate := benchEnvInt(b, "BENCH_RATE", 1000)
	seconds := benchEnvInt(b, "BENCH_SECONDS", 10)
	for _, mode := range []notifyMode{notifyAfterCommit, notifyInTx} {
		b.Run("notify="+string(mode), func(b *testing.B) {
			lags := make([]time.Duration, 0, b.N*rate*seconds)
			var parts lagParts
			var achieved float64
			for range b.N {
				bd := setup(b)
				l, p, a := measureLag(b, bd, bd.relay(b, Config{}), mode, rate, seconds)
				lags, achieved = append(lags, l...), a
				parts.wait, parts.take, parts.push = append(parts.wait, p.wait...), append(parts.take, p.take...), append(parts.push, p.push...)
			}
			b.ReportMetric(achieved, "events/s")
			reportPercentiles(b, lags, "", 0.50, 0.99, 0.999, 1)
			reportPercentiles(b, parts.wait, "wait_", 0.50, 0.99)
			reportPercentiles(b, parts.take, "take_", 0.50, 0.99)
			reportPercentiles(b, parts.push, "push_", 0.50, 0.99)
		})
	}
}

// reportPercentiles reports quantiles of durations in ms as metrics named
// prefix+"p50_ms" (1 is "max_ms").
func reportPercentiles(b *testing.B, durations []time.Duration, prefix string, quantiles ...float64) {
	slices.Sort(durations)
	for _, q := range quantiles {
		name := fmt.Sprintf("p%g_ms", q*100)
		if q == 1 {
			name = "max_ms"
		}
		b.ReportMetric(float64(percentile(durations, q).Microseconds())/1000, prefix+name)
	}
}

// percentile returns the p-th quantile of sorted durations.
func percentile(sorted []time.Duration, p float64) time.Duration {
	return sorted[int(float64(len(sorted)-1)*p)]
}
