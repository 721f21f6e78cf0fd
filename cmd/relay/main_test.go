package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
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
		{Env: oncetest.EnvWith(base, "REDIS_URL", "http://x"), Want: "REDIS_URL"},
		{Env: oncetest.EnvWith(base, "REDIS_SENTINEL_URL", "redis://127.0.0.1:1?master_name=m"), Want: "not several"},
		{Env: map[string]string{"DATABASE_URL": "postgres://x", "REDIS_SENTINEL_URL": "redis://127.0.0.1:1"}, Want: "REDIS_SENTINEL_URL: master_name is required"},
		{Env: oncetest.EnvWith(base, "RELAY_REDIS_WAIT_REPLICAS", "-1"), Want: `RELAY_REDIS_WAIT_REPLICAS="-1": must be a non-negative integer`},
		{Env: map[string]string{"DATABASE_URL": "postgres://x", "REDIS_CLUSTER_URL": "redis://127.0.0.1:1", "RELAY_REDIS_WAIT_REPLICAS": "1"}, Want: "RELAY_REDIS_WAIT_REPLICAS needs REDIS_URL or REDIS_SENTINEL_URL"},
		{Env: oncetest.EnvWith(base, "RELAY_BATCH", "0"), Want: `RELAY_BATCH="0": must be a positive integer`},
		{Env: oncetest.EnvWith(base, "RELAY_POLL_INTERVAL", "soon"), Want: `RELAY_POLL_INTERVAL="soon": not a duration`},
		{Env: oncetest.EnvWith(base, "RELAY_POLL_INTERVAL", "0s"), Want: "RELAY_POLL_INTERVAL must be positive"},
		{Env: oncetest.EnvWith(base, "RELAY_MAX_ATTEMPTS", "-3"), Want: "RELAY_MAX_ATTEMPTS"},
		{Env: base, Args: []string{"--nope"}, Want: "flag provided but not defined"},
		{Env: base, Args: []string{"now"}, Want: `unexpected argument "now"`},
	})
}

func TestRefusesAnOutdatedSchema(t *testing.T) {
	code, stdout, stderr := oncetest.RunMain(t, run, map[string]string{
		"DATABASE_URL": oncetest.EmptyDatabaseURL(t), "REDIS_URL": oncetest.RedisURL(t),
	}, "--once")
	oncetest.RequireOneLineError(t, code, stdout, stderr, "api migrate up")
}

func TestOncePrintsASummary(t *testing.T) {
	oncetest.OnEachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		dbURL := oncetest.DatabaseURL(t)
		prefix := oncetest.KeyPrefix(t, rdb)
		pool := oncetest.Pool(t, dbURL)
		ctx := oncetest.Context(t)
		store := outbox.New(outbox.Config{})
		owner := keystate.Owner{1}
		for _, key := range []string{"a", "b", "c"} {
			_, err := store.Claim(ctx, pool, keystate.Ref{Scope: "s", Key: key}, "v1:fp", owner, time.Minute)
			require.NoError(t, err)
		}
		env := oncetest.EnvWith(oncetest.RedisEnv(rdb, prefix), "DATABASE_URL", dbURL)

		code, stdout, stderr := oncetest.RunMain(t, run, env, "--once")
		require.Equal(t, 0, code, stderr)
		var summary map[string]int64
		require.NoError(t, json.Unmarshal([]byte(stdout), &summary), "stdout is one JSON line: %q", stdout)
		require.EqualValues(t, 3, summary["published"])
		require.Contains(t, summary, "duration_ms")
		require.Equal(t, 1, strings.Count(stdout, "\n"))

		e, found, err := cache.New(rdb, cache.Options{Prefix: prefix}).Read(ctx, keystate.Ref{Scope: "s", Key: "b"})
		require.NoError(t, err)
		require.True(t, found)
		require.Equal(t, keystate.InProgress, e.State)

		code, stdout, _ = oncetest.RunMain(t, run, env, "--once")
		require.Equal(t, 0, code)
		require.Contains(t, stdout, `"published":0`)
	})
}

// TestWriteLayout1 is a rolling upgrade from a release before layout 2:
// with REDIS_WRITE_LAYOUT1 the relay copies a completed key in layout 1
// (ASCII flag 'c' after completed:<version>:), which that release reads;
// without it, in layout 2 (a flag byte of 0x80 or more).
func TestWriteLayout1(t *testing.T) {
	rdb, prefix := oncetest.Redis(t)
	dbURL := oncetest.DatabaseURL(t)
	pool := oncetest.Pool(t, dbURL)
	ctx := oncetest.Context(t)
	store := outbox.New(outbox.Config{})
	for _, layout1 := range []bool{false, true} {
		ref := keystate.Ref{Scope: "s", Key: fmt.Sprintf("layout1-%v", layout1)}
		owner := keystate.Owner{2}
		claim, err := store.Claim(ctx, pool, ref, "v1:fp", owner, time.Minute)
		require.NoError(t, err)
		require.True(t, claim.Claimed)
		_, err = store.Complete(ctx, pool, ref, owner, keystate.Response{Status: 201, Body: []byte(`{"id":1}`)})
		require.NoError(t, err)

		env := oncetest.EnvWith(oncetest.EnvWith(oncetest.RedisEnv(rdb, prefix), "DATABASE_URL", dbURL), "REDIS_WRITE_LAYOUT1", strconv.FormatBool(layout1))
		code, _, stderr := oncetest.RunMain(t, run, env, "--once")
		require.Equal(t, 0, code, stderr)
		raw, err := rdb.Get(ctx, cache.KeyName(prefix, ref)).Bytes()
		require.NoError(t, err)
		head := len("completed:2:")
		require.Equal(t, "completed:2:", string(raw[:head]))
		require.Equal(t, layout1, raw[head] == 'c', "layout 1: %v, value %q", layout1, raw)
	}
}

// TestDaemon runs the relay binary: it delivers, serves its metrics, and
// exits 0 soon after SIGTERM.
func TestDaemon(t *testing.T) {
	bin := oncetest.BuildBinary(t, ".")
	dbURL := oncetest.DatabaseURL(t)
	rdb, prefix := oncetest.Redis(t)
	addr := oncetest.FreeAddr(t)
	cmd := exec.CommandContext(t.Context(), bin)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL, "REDIS_URL="+oncetest.RedisURL(t),
		"REDIS_PREFIX="+prefix, "HTTP_ADDR="+addr, "LOG_FORMAT=text")
	var logs bytes.Buffer
	cmd.Stderr = &logs
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	oncetest.WaitReady(t, addr)

	ctx := oncetest.Context(t)
	pool := oncetest.Pool(t, dbURL)
	_, err := outbox.New(outbox.Config{}).Claim(ctx, pool, keystate.Ref{Scope: "s", Key: "k"}, "v1:fp", keystate.Owner{1}, time.Minute)
	require.NoError(t, err)
	c := cache.New(rdb, cache.Options{Prefix: prefix})
	oncetest.Eventually(t, 5*time.Second, "event delivered", func() bool {
		_, found, _ := c.Read(ctx, keystate.Ref{Scope: "s", Key: "k"})
		return found
	})

	// The batch is counted once its deletion commits, just after Redis
	// acknowledged it.
	var body []byte
	oncetest.Eventually(t, 5*time.Second, "batch counted", func() bool {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
		require.NoError(t, err)
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		body, _ = io.ReadAll(res.Body)
		res.Body.Close()
		return bytes.Contains(body, []byte("onceonly_relay_events_published_total 1"))
	})
	for _, metric := range []string{"onceonly_relay_events_published_total 1", "onceonly_relay_lag_seconds_bucket",
		"onceonly_relay_batch_size_bucket", "onceonly_relay_pending_events", "onceonly_relay_errors_total"} {
		require.Contains(t, string(body), metric)
	}

	start := time.Now()
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait(), logs.String())
	require.Less(t, time.Since(start), 10*time.Second)
	var left int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox`).Scan(&left))
	require.Zero(t, left)
}

func TestConfigurationIsDocumented(t *testing.T) {
	oncetest.RequireDocumented(t, run)
}
