package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/oncetest"
	"github.com/onceonly/onceonly/outbox"
)

func TestBadConfiguration(t *testing.T) {
	base := map[string]string{"DATABASE_URL": "postgres://x", "REDIS_URL": "redis://127.0.0.1:1/0"}
	oncetest.RequireRejections(t, run, []oncetest.Rejection{
		{Env: oncetest.EnvWith(base, "DATABASE_URL", ""), Want: "DATABASE_URL (or -database-url) is required"},
		{Env: oncetest.EnvWith(base, "REDIS_URL", ""), Want: "REDIS_URL (or REDIS_CLUSTER_URL or REDIS_SENTINEL_URL) is required"},
		{Env: oncetest.EnvWith(base, "RECONCILE_SCHEDULE", "every minute"), Want: `RECONCILE_SCHEDULE="every minute"`},
		{Env: oncetest.EnvWith(base, "RECONCILE_SCHEDULE", "@every soon"), Want: `RECONCILE_SCHEDULE="@every soon"`},
		{Env: oncetest.EnvWith(base, "REAP_GRACE", "1 second"), Want: `REAP_GRACE="1 second": not a duration`},
		{Env: oncetest.EnvWith(base, "FAILED_TTL", "0s"), Want: "FAILED_TTL must be positive"},
		{Env: oncetest.EnvWith(base, "RECONCILE_PAGE_SIZE", "many"), Want: "RECONCILE_PAGE_SIZE"},
		{Env: base, Args: []string{"--dry-run"}, Want: "--dry-run needs --once"},
		{Env: base, Args: []string{"--once", "extra"}, Want: `unexpected argument "extra"`},
	})
}

func TestRefusesAnOutdatedSchema(t *testing.T) {
	code, stdout, stderr := oncetest.RunMain(t, run, map[string]string{
		"DATABASE_URL": oncetest.EmptyDatabaseURL(t), "REDIS_URL": oncetest.RedisURL(t),
	}, "--once")
	oncetest.RequireOneLineError(t, code, stdout, stderr, "api migrate up")
}

// seed writes n completed keys in Postgres only.
func seed(t *testing.T, dbURL string, n int) {
	t.Helper()
	ctx := oncetest.Context(t)
	pool := oncetest.Pool(t, dbURL)
	store := outbox.New(outbox.Config{})
	owner := keystate.Owner{3}
	for i := range n {
		key := "k" + string(rune('a'+i))
		_, err := store.Claim(ctx, pool, keystate.Ref{Scope: "s", Key: key}, "v1:fp", owner, time.Minute)
		require.NoError(t, err)
		_, err = store.Complete(ctx, pool, keystate.Ref{Scope: "s", Key: key}, owner, keystate.Response{Status: 201, Body: []byte("{}")})
		require.NoError(t, err)
	}
}

func TestOncePrintsTheReport(t *testing.T) {
	oncetest.OnEachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		dbURL := oncetest.DatabaseURL(t)
		prefix := oncetest.KeyPrefix(t, rdb)
		seed(t, dbURL, 4)
		env := oncetest.EnvWith(oncetest.RedisEnv(rdb, prefix), "DATABASE_URL", dbURL)

		for _, tc := range []struct {
			args            []string
			missing, repair int
		}{
			{[]string{"--once", "--dry-run"}, 4, 0},
			{[]string{"--once"}, 4, 4},
			{[]string{"--once"}, 0, 0},
		} {
			code, stdout, stderr := oncetest.RunMain(t, run, env, tc.args...)
			require.Equal(t, 0, code, stderr)
			var rep map[string]any
			require.NoError(t, json.Unmarshal([]byte(stdout), &rep), "one JSON line: %q", stdout)
			for _, field := range []string{"scanned", "in_sync", "missing", "stale", "orphaned", "repaired",
				"leases_reaped", "expired_deleted", "duration_ms"} {
				require.Contains(t, rep, field)
			}
			require.EqualValues(t, 4, rep["scanned"])
			require.EqualValues(t, tc.missing, rep["missing"], tc.args)
			require.EqualValues(t, tc.repair, rep["repaired"], tc.args)
		}
	})
}

// TestDaemon runs the reconciler binary on a short schedule: it repairs a
// deleted Redis key on its own and exits 0 soon after SIGTERM.
func TestDaemon(t *testing.T) {
	bin := oncetest.BuildBinary(t, ".")
	dbURL := oncetest.DatabaseURL(t)
	rdb, prefix := oncetest.Redis(t)
	seed(t, dbURL, 3)
	addr := oncetest.FreeAddr(t)
	cmd := exec.CommandContext(t.Context(), bin)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL, "REDIS_URL="+oncetest.RedisURL(t),
		"REDIS_PREFIX="+prefix, "HTTP_ADDR="+addr, "RECONCILE_SCHEDULE=@every 200ms", "LOG_FORMAT=text")
	var logs bytes.Buffer
	cmd.Stderr = &logs
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	oncetest.WaitReady(t, addr)

	ctx := oncetest.Context(t)
	c := cache.New(rdb, cache.Options{Prefix: prefix})
	oncetest.Eventually(t, 10*time.Second, "keys repaired by a scheduled pass", func() bool {
		_, found, _ := c.Read(ctx, keystate.Ref{Scope: "s", Key: "kb"})
		return found
	})
	require.NoError(t, rdb.Del(ctx, c.Key(keystate.Ref{Scope: "s", Key: "kb"})).Err())
	oncetest.Eventually(t, 10*time.Second, "a deleted key repaired again", func() bool {
		_, found, _ := c.Read(ctx, keystate.Ref{Scope: "s", Key: "kb"})
		return found
	})

	start := time.Now()
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait(), logs.String())
	require.Less(t, time.Since(start), 10*time.Second)
	require.Contains(t, logs.String(), "reconcile pass")
}

func TestConfigurationIsDocumented(t *testing.T) {
	oncetest.RequireDocumented(t, run)
}
