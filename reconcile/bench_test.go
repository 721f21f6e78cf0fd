package reconcile

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/oncetest"
)

// benchReconciler returns a Reconciler on the servers bench/reconcile.sh
// seeded (RECONCILE_BENCH_DATABASE_URL, RECONCILE_BENCH_REDIS_URL), or skips.
func benchReconciler(b *testing.B) *Reconciler {
	b.Helper()
	dbURL, redisURL := os.Getenv("RECONCILE_BENCH_DATABASE_URL"), os.Getenv("RECONCILE_BENCH_REDIS_URL")
	if dbURL == "" || redisURL == "" {
		b.Skip("RECONCILE_BENCH_DATABASE_URL and RECONCILE_BENCH_REDIS_URL name the servers bench/reconcile.sh seeded")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(b, err)
	b.Cleanup(pool.Close)
	opts, err := redis.ParseURL(redisURL)
	require.NoError(b, err)
	rdb := redis.NewClient(opts)
	b.Cleanup(func() { _ = rdb.Close() })
	r, err := New(Config{
		Pool: pool, Redis: rdb,
		Logger: oncetest.QuietLogger(), Registerer: prometheus.NewRegistry(),
	})
	require.NoError(b, err)
	return r
}

// BenchmarkPass times whole passes and each scan alone over the keyspace
// bench/reconcile.sh seeded (in step), reporting keys/s and the CPU seconds
// the reconciler, Redis and Postgres spent per pass. Run it with
// -benchtime=1x, and -cpuprofile to see where the reconciler's CPU goes:
//
//	RECONCILE_BENCH_DATABASE_URL=postgres://postgres@127.0.0.1:61732/bench_reconcile \
//	RECONCILE_BENCH_REDIS_URL=redis://127.0.0.1:61779/0 \
//	RECONCILE_BENCH_PG_PID=$(head -1 .data/bench/pg/postmaster.pid) \
//	go test -run '^$' -bench Pass -benchtime 1x ./reconcile/
func BenchmarkPass(b *testing.B) {
	for _, side := range []struct {
		name string
		run  func(r *Reconciler, ctx context.Context, rep *Report) error
	}{
		{"whole", func(r *Reconciler, ctx context.Context, rep *Report) error {
			var err error
			*rep, err = r.Pass(ctx, false)
			return err
		}},
		{"postgres", func(r *Reconciler, ctx context.Context, rep *Report) error {
			return pgx.BeginFunc(ctx, r.cfg.Pool, func(tx pgx.Tx) error {
				return r.scanPostgres(ctx, tx, rep, newTally())
			})
		}},
		{"redis", func(r *Reconciler, ctx context.Context, rep *Report) error {
			return r.tallyRedis(ctx, rep, newTally(), map[string]bool{})
		}},
	} {
		b.Run(side.name, func(b *testing.B) {
			r := benchReconciler(b)
			var keys int64
			began := time.Now()
			c0 := cpuNow(b, r)
			for b.Loop() {
				var rep Report
				require.NoError(b, side.run(r, context.Background(), &rep))
				require.Zero(b, rep.Drift())
				keys += max(rep.Scanned, rep.RedisScanned)
			}
			b.ReportMetric(float64(keys)/time.Since(began).Seconds(), "keys/s")
			c1 := cpuNow(b, r)
			b.ReportMetric((c1.goSec-c0.goSec)/float64(b.N), "go-cpu-s/op")
			b.ReportMetric((c1.redisSec-c0.redisSec)/float64(b.N), "redis-cpu-s/op")
			b.ReportMetric((c1.pgSec-c0.pgSec)/float64(b.N), "pg-cpu-s/op")
		})
	}
}

type cpuTimes struct{ goSec, redisSec, pgSec float64 }

// cpuNow reads the CPU time used so far by this process, the Redis server
// (INFO cpu) and the Postgres server (RECONCILE_BENCH_PG_PID, its
// postmaster: its own and its children's, living and exited, from /proc).
func cpuNow(b *testing.B, r *Reconciler) cpuTimes {
	b.Helper()
	var c cpuTimes
	var ru syscall.Rusage
	require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	c.goSec = float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
	info := r.cfg.Redis.Info(context.Background(), "cpu").Val()
	for line := range strings.SplitSeq(info, "\r\n") {
		for _, f := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if v, ok := strings.CutPrefix(line, f); ok {
				x, _ := strconv.ParseFloat(v, 64)
				c.redisSec += x
			}
		}
	}
	pid := os.Getenv("RECONCILE_BENCH_PG_PID")
	if pid == "" {
		return c
	}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		stat, err := os.ReadFile("/proc/" + p.Name() + "/stat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+2:]))
		// f[0] is field 3 (state): ppid is f[1], utime f[11], stime f[12], cutime f[13], cstime f[14].
		ticks := func(i int) float64 { x, _ := strconv.ParseFloat(f[i], 64); return x / 100 }
		switch {
		case p.Name() == pid:
			c.pgSec += ticks(11) + ticks(12) + ticks(13) + ticks(14)
		case f[1] == pid:
			c.pgSec += ticks(11) + ticks(12)
		}
	}
	return c
}
