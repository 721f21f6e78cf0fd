package console_test

import (
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/console"
	"github.com/onceonly/onceonly/oncetest"
)

// BenchmarkPagesAtScale measures the key page and the key list, filtered,
// on a table of BENCH_KEYS keys (default 1,000,000): half in one scope, the
// rest over 997 others; 95% completed, 4% failed, 1% in progress. Each
// page is served in-process (no network), the database warm, and reports
// its median and 99th percentile.
//
//	go test -run '^$' -bench PagesAtScale -benchtime 200x ./console
func BenchmarkPagesAtScale(b *testing.B) {
	keys := 1_000_000
	if s := os.Getenv("BENCH_KEYS"); s != "" {
		var err error
		keys, err = strconv.Atoi(s)
		require.NoError(b, err)
	}
	ctx := oncetest.Context(b)
	pool := oncetest.DB(b)
	rdb, prefix := oncetest.Redis(b)
	start := time.Now()
	_, err := pool.Exec(ctx, `INSERT INTO idempotency_keys (scope, key, status, version, fingerprint, owner, lease_expires_at,
			response_status, response_content_type, response_body, expires_at, steps, handler)
		SELECT CASE WHEN i % 2 = 0 THEN 'acct_big' ELSE 'acct_' || lpad((i % 997)::text, 4, '0') END,
			'key-' || md5(i::text), s.status, 1 + i % 5, 'v1:' || md5((i * 7)::text),
			CASE WHEN s.status = 'in_progress' THEN gen_random_uuid() END,
			CASE WHEN s.status = 'in_progress' THEN now() + ((i % 60) - 30) * interval '1 second' END,
			CASE WHEN s.status = 'completed' THEN 201 END,
			CASE WHEN s.status = 'completed' THEN 'application/json' END,
			CASE WHEN s.status = 'completed' THEN convert_to(repeat('{"id":"pay_' || i || '"}', 8), 'UTF8') END,
			now() + interval '1 day', CASE WHEN s.status = 'in_progress' AND i % 3 = 0 THEN '{"charge":{}}'::jsonb END,
			CASE WHEN s.status = 'in_progress' AND i % 3 = 0 THEN 'payments.create' END
		FROM generate_series(1, $1::int) i
		CROSS JOIN LATERAL (SELECT CASE WHEN i % 100 < 95 THEN 'completed' WHEN i % 100 < 99 THEN 'failed' ELSE 'in_progress' END AS status) s`, keys)
	require.NoError(b, err)
	_, err = pool.Exec(ctx, `VACUUM ANALYZE idempotency_keys`)
	require.NoError(b, err)
	b.Logf("%d keys written and analyzed in %s", keys, time.Since(start).Round(time.Second))

	engine, err := onceonly.New(onceonly.Config{Pool: pool, Redis: rdb, RedisPrefix: prefix, Logger: oncetest.QuietLogger()})
	require.NoError(b, err)
	b.Cleanup(engine.Close)
	c, err := console.New(console.Config{Engine: engine, Pool: pool, Auth: user + ":" + password, Logger: oncetest.QuietLogger()})
	require.NoError(b, err)

	var aKey string
	require.NoError(b, pool.QueryRow(ctx, `SELECT key FROM idempotency_keys WHERE scope = 'acct_big' AND status = 'completed' LIMIT 1`).Scan(&aKey))
	for _, page := range []struct{ name, path string }{
		{"key", keyPath("acct_big", aKey)},
		{"list", "/console/keys"},
		{"list-scope", "/console/keys?scope=acct_0042"},
		{"list-scope-prefix", "/console/keys?scope=acct_big&prefix=key-ab"},
		{"list-state-failed", "/console/keys?state=failed"},
		{"list-scope-state-in_progress", "/console/keys?scope=acct_big&state=in_progress"},
		{"list-prefix-state-in_progress", "/console/keys?prefix=key-a&state=in_progress"},
		{"overview", "/console/"},
	} {
		b.Run(page.name, func(b *testing.B) {
			serve := func() time.Duration {
				req := httptest.NewRequestWithContext(ctx, http.MethodGet, page.path, nil)
				req.SetBasicAuth(user, password)
				rec := httptest.NewRecorder()
				began := time.Now()
				c.ServeHTTP(rec, req)
				took := time.Since(began)
				if rec.Code != http.StatusOK {
					b.Fatalf("%s: %d %s", page.path, rec.Code, rec.Body.String())
				}
				return took
			}
			serve() // warm: the plan's pages in the buffer cache
			took := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for b.Loop() {
				took = append(took, serve())
			}
			b.StopTimer()
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(took[len(took)*99/100].Microseconds())/1000, "p99-ms")
		})
	}
}
