package main

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/oncetest"
	"github.com/onceonly/onceonly/outbox"
)

// TestThroughPgBouncer runs the relay with DATABASE_URL on PgBouncer in
// transaction mode: without DATABASE_SESSION_URL it polls and runs nothing
// session-bound; with it, it LISTENs there and delivers on the
// notification (the poll interval is an hour); --once drains.
func TestThroughPgBouncer(t *testing.T) {
	bin := oncetest.BuildBinary(t, ".")
	for _, tc := range []struct {
		name    string
		session bool
	}{{"polls", false}, {"listens on DATABASE_SESSION_URL", true}} {
		t.Run(tc.name, func(t *testing.T) {
			dbURL := oncetest.DatabaseURL(t)
			bouncerURL := oncetest.PgBouncerURL(t, dbURL, "exec")
			rdb, prefix := oncetest.Redis(t)
			ctx := oncetest.Context(t)
			pool := oncetest.Pool(t, dbURL)
			env := []string{"DATABASE_URL=" + bouncerURL, "REDIS_URL=" + oncetest.RedisURL(t), "REDIS_PREFIX=" + prefix,
				"RELAY_POLL_INTERVAL=100ms"}
			if tc.session {
				env = append(env, "DATABASE_SESSION_URL="+dbURL, "RELAY_POLL_INTERVAL=1h")
			}
			d := oncetest.StartDaemon(t, bin, env...)

			listeners := func() (n int) {
				require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
					WHERE datname = current_database() AND query LIKE 'LISTEN %'`).Scan(&n))
				return n
			}
			if tc.session {
				oncetest.Eventually(t, 5*time.Second, "LISTEN on the session URL", func() bool { return listeners() == 1 })
			}
			_, err := outbox.New(outbox.Config{}).Claim(ctx, pool, keystate.Ref{Scope: "s", Key: "k"}, "v1:fp", keystate.Owner{1}, time.Minute)
			require.NoError(t, err)
			c := cache.New(rdb, cache.Options{Prefix: prefix})
			oncetest.Eventually(t, 5*time.Second, "event delivered", func() bool {
				_, found, _ := c.Read(ctx, keystate.Ref{Scope: "s", Key: "k"})
				return found
			})
			if !tc.session {
				require.Zero(t, listeners(), "nothing session-bound runs without DATABASE_SESSION_URL")
			}
			require.NotContains(t, d.Logs.String(), "level=WARN", d.Logs.String())
		})
	}

	t.Run("once", func(t *testing.T) {
		dbURL := oncetest.DatabaseURL(t)
		rdb, prefix := oncetest.Redis(t)
		ctx := oncetest.Context(t)
		pool := oncetest.Pool(t, dbURL)
		for _, key := range []string{"a", "b"} {
			_, err := outbox.New(outbox.Config{}).Claim(ctx, pool, keystate.Ref{Scope: "s", Key: key}, "v1:fp", keystate.Owner{1}, time.Minute)
			require.NoError(t, err)
		}
		env := map[string]string{"DATABASE_URL": oncetest.PgBouncerURL(t, dbURL, "simple_protocol"),
			"REDIS_URL": oncetest.RedisURL(t), "REDIS_PREFIX": prefix}
		code, stdout, stderr := oncetest.RunMain(t, run, env, "--once")
		require.Equal(t, 0, code, stderr)
		var summary map[string]int64
		require.NoError(t, json.Unmarshal([]byte(stdout), &summary))
		require.EqualValues(t, 2, summary["published"])
		oncetest.RequireConverged(t, ctx, pool, cache.New(rdb, cache.Options{Prefix: prefix}), "%")
	})
}
