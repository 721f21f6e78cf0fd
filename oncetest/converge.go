package oncetest

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/keystate"
)

// Drift lists every live Postgres key whose key matches the SQL LIKE
// pattern and whose Redis copy is missing or differs in state or version.
func Drift(tb testing.TB, ctx context.Context, pool *pgxpool.Pool, c *cache.Cache, pattern string) []string {
	tb.Helper()
	rows, err := pool.Query(ctx, `SELECT scope, key, status, version FROM idempotency_keys
		WHERE key LIKE $1 AND expires_at > now() ORDER BY 1, 2`, pattern)
	if err != nil {
		tb.Fatalf("read keys: %v", err)
	}
	defer rows.Close()
	var drift []string
	for rows.Next() {
		var scope, key, status string
		var version int64
		if err := rows.Scan(&scope, &key, &status, &version); err != nil {
			tb.Fatalf("read keys: %v", err)
		}
		e, found, err := c.Read(ctx, keystate.Ref{Scope: scope, Key: key})
		if err != nil && found {
			drift = append(drift, fmt.Sprintf("%s:%s: Redis value does not decode: %v", scope, key, err))
			continue
		}
		if err != nil {
			tb.Fatalf("read Redis: %v", err)
		}
		if !found || string(e.State) != status || e.Version != version {
			drift = append(drift, fmt.Sprintf("%s:%s: Postgres %s v%d, Redis %s v%d (found %v)",
				scope, key, status, version, e.State, e.Version, found))
		}
	}
	if err := rows.Err(); err != nil {
		tb.Fatalf("read keys: %v", err)
	}
	return drift
}

// RequireConverged fails the test for every key Drift lists.
func RequireConverged(tb testing.TB, ctx context.Context, pool *pgxpool.Pool, c *cache.Cache, pattern string) {
	tb.Helper()
	for _, d := range Drift(tb, ctx, pool, c, pattern) {
		tb.Error(d)
	}
}
