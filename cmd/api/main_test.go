package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/migrations"
	"github.com/onceonly/onceonly/oncetest"
	"github.com/onceonly/onceonly/outbox"
)

// migrationCount is the number of the library's migrations, numbered 1…n.
func migrationCount(t *testing.T) int {
	t.Helper()
	return len(migrationFiles(t))
}

// migrationFiles returns the engine's embedded migrations, in order.
func migrationFiles(t *testing.T) []string {
	t.Helper()
	files, err := fs.Glob(migrations.FS(), "*.sql")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	return files
}

func runAPI(t *testing.T, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return oncetest.RunMain(t, run, env, args...)
}

func TestBadConfiguration(t *testing.T) {
	oncetest.RequireRejections(t, run, []oncetest.Rejection{
		{Env: map[string]string{"DATABASE_URL": ""}, Want: "DATABASE_URL (or -database-url) is required"},
		{Env: map[string]string{"DATABASE_URL": "postgres://x", "LEASE_TIMEOUT": "ten"}, Want: `LEASE_TIMEOUT="ten": not a duration`},
		{Env: map[string]string{"DATABASE_URL": "postgres://x", "LOG_LEVEL": "loud"}, Want: `LOG_LEVEL="loud"`},
		{Env: map[string]string{"DATABASE_URL": "postgres://x", "DEFER_NOTIFY": "maybe"}, Want: `DEFER_NOTIFY="maybe": use true or false`},
		{Env: map[string]string{"DATABASE_URL": "postgres://x"}, Args: []string{"-lease-timeout", "-1s"}, Want: "must not be negative"},
		{Env: map[string]string{"DATABASE_URL": "postgres://x"}, Args: []string{"-nope"}, Want: "flag provided but not defined"},
		{Env: map[string]string{"DATABASE_URL": "postgres://x"}, Args: []string{"migrate"}, Want: "say up, down, status or version"},
		{Env: map[string]string{"DATABASE_URL": "postgres://x"}, Args: []string{"migrate", "sideways"}, Want: `unknown command "sideways"`},
		{Env: map[string]string{"DATABASE_URL": "postgres://x", "API_KEYS": "nokey"}, Want: "API_KEYS"},
		{Env: map[string]string{"DATABASE_URL": "postgres://x", "REDIS_URL": "http://x"}, Want: "REDIS_URL"},
		{Env: map[string]string{"DATABASE_URL": "postgres://x", "REDIS_URL": "redis://a", "REDIS_CLUSTER_URL": "redis://b"}, Want: "not both"},
		{Env: map[string]string{"DATABASE_URL": "postgres://x", "CONSOLE_AUTH": "nocolon"}, Want: "CONSOLE_AUTH must be user:password"},
		{Env: map[string]string{"DATABASE_URL": "postgres://x", "CONSOLE_AUTH": "ops:"}, Want: "CONSOLE_AUTH must be user:password"},
		{Env: map[string]string{"DATABASE_URL": "postgres://x", "CONSOLE_READONLY": "maybe"}, Want: `CONSOLE_READONLY="maybe": use true or false`},
		{Env: map[string]string{"DATABASE_URL": "postgres://x", "CONSOLE_ADDR": "127.0.0.1:8081"}, Want: "CONSOLE_ADDR needs CONSOLE_AUTH"},
	})
}

func TestMigrateAndSchemaCheck(t *testing.T) {
	url := oncetest.EmptyDatabaseURL(t)
	env := map[string]string{"DATABASE_URL": url, "HTTP_ADDR": "127.0.0.1:0"}

	code, _, stderr := runAPI(t, env)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "api migrate up", "a daemon on an outdated schema names the fix")

	code, stdout, _ := runAPI(t, env, "migrate", "version")
	require.Equal(t, 0, code)
	require.Equal(t, "0\n", stdout)

	code, stdout, stderr = runAPI(t, env, "migrate", "up")
	require.Equal(t, 0, code, stderr)
	n := migrationCount(t)
	require.Contains(t, stdout, fmt.Sprintf("applied %d migration(s); schema at version %d", n, n))
	require.Contains(t, stdout, "demo schema: applied 2 migration(s)")

	code, stdout, _ = runAPI(t, env, "migrate", "status")
	require.Equal(t, 0, code)
	require.Equal(t, n, strings.Count(stdout, " engine "), stdout)
	require.Equal(t, 2, strings.Count(stdout, " demo "), stdout)
	require.Equal(t, n+2, strings.Count(stdout, "applied"), stdout)

	code, stdout, _ = runAPI(t, env, "migrate", "down")
	require.Equal(t, 0, code)
	files := migrationFiles(t)
	require.Contains(t, stdout, files[len(files)-1], "the last migration rolled back")
	code, stdout, _ = runAPI(t, env, "migrate", "up")
	require.Equal(t, 0, code)
	require.Contains(t, stdout, "applied 1 migration(s)")
}

// TestGracefulShutdown: SIGTERM during a request lets it finish, leaves no
// key claimed, and the process exits 0 well within 10 s.
func TestGracefulShutdown(t *testing.T) {
	t.Parallel() // waits on processes and leases more than it computes
	bin := binary(t, ".")
	dbURL := oncetest.DatabaseURL(t)
	addr := oncetest.FreeAddr(t)
	cmd := exec.CommandContext(t.Context(), bin)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL, "REDIS_URL="+oncetest.RedisURL(t),
		"REDIS_PREFIX=shutdown"+oncetest.RandomSuffix(6)+":", "HTTP_ADDR="+addr, "SLOW_GATEWAY_DELAY=1s", "LOG_FORMAT=text")
	var logs bytes.Buffer
	cmd.Stderr = &logs
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	oncetest.WaitReady(t, addr)

	type result struct {
		status int
		err    error
	}
	done := make(chan result)
	ctx := oncetest.Context(t)
	go func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/payments",
			strings.NewReader(`{"amount":5,"currency":"eur","customer":"c","source":"tok_slow"}`))
		if err != nil {
			done <- result{err: err}
			return
		}
		req.Header.Set("Authorization", "Bearer sk_test_demo")
		req.Header.Set("Idempotency-Key", "shutdown-1")
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- result{err: err}
			return
		}
		res.Body.Close()
		done <- result{status: res.StatusCode}
	}()
	pool := oncetest.Pool(t, dbURL)
	oncetest.AwaitClaimed(t, ctx, pool, "shutdown-1") // the request is in flight
	start := time.Now()
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	res := <-done
	require.NoError(t, res.err)
	require.Equal(t, http.StatusCreated, res.status, "the in-flight request finished")
	require.NoError(t, cmd.Wait(), logs.String())
	require.Less(t, time.Since(start), 10*time.Second)

	var claimed, paid int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'in_progress'), count(*) FROM idempotency_keys`).Scan(&claimed, &paid))
	require.Equal(t, 0, claimed, "nothing left claimed")
	require.Equal(t, 1, paid)
	require.Contains(t, logs.String(), "shutting down", logs.String())
}

func TestKeysShowAndPurge(t *testing.T) {
	oncetest.OnEachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		dbURL := oncetest.DatabaseURL(t)
		st := oncetest.NewStack(t, oncetest.OnPool(oncetest.Pool(t, dbURL)), oncetest.OnRedis(rdb))
		prefix := st.Cache.Prefix()
		st.Complete(t, "acct_k", "order-1", `{"ok":true}`)
		k, _, err := st.Store.Get(st.Ctx, st.Pool, keystate.Ref{Scope: "acct_k", Key: "order-1"})
		require.NoError(t, err)
		_, err = st.Cache.Apply(st.Ctx, k)
		require.NoError(t, err)
		env := oncetest.EnvWith(oncetest.RedisEnv(rdb, prefix), "DATABASE_URL", dbURL)

		var view keyView
		code, stdout, stderr := runAPI(t, env, "keys", "show", "acct_k", "order-1")
		require.Equal(t, 0, code, stderr)
		require.NoError(t, json.Unmarshal([]byte(stdout), &view))
		require.Equal(t, "completed", view.Postgres.Status)
		require.EqualValues(t, 2, view.Postgres.Version)
		require.True(t, view.Redis.Found)
		require.Equal(t, "completed", view.Redis.State)
		require.True(t, *view.InSync)

		code, stdout, stderr = runAPI(t, env, "keys", "purge", "acct_k", "order-1")
		require.Equal(t, 0, code, stderr)
		require.NoError(t, json.Unmarshal([]byte(stdout), &view))
		require.EqualValues(t, 3, view.Postgres.Version)
		require.LessOrEqual(t, view.Postgres.ExpiresInMs, int64(0))
		require.False(t, view.Redis.Found, "the Redis copy is gone at once")
		var events int
		require.NoError(t, st.Pool.QueryRow(st.Ctx, `SELECT count(*) FROM outbox WHERE key = 'order-1' AND version = 3`).Scan(&events))
		require.Equal(t, 1, events, "the purge goes through the outbox")

		// The next request for the key is a first execution, one version on.
		res, err := st.Store.Claim(st.Ctx, st.Pool, keystate.Ref{Scope: "acct_k", Key: "order-1"}, "v1:new", keystate.Owner{5}, time.Minute)
		require.NoError(t, err)
		require.True(t, res.Claimed)
		require.EqualValues(t, 4, res.Key.Version)

		code, stdout, stderr = runAPI(t, env, "keys", "purge", "acct_k", "order-1")
		oncetest.RequireOneLineError(t, code, stdout, stderr, "in progress")
		code, _, stderr = runAPI(t, env, "keys", "purge", "--force", "acct_k", "order-1")
		require.Equal(t, 0, code, stderr)
		_, err = st.Store.Complete(st.Ctx, st.Pool, keystate.Ref{Scope: "acct_k", Key: "order-1"}, keystate.Owner{5}, keystate.Response{Status: 201})
		require.ErrorIs(t, err, outbox.ErrLeaseLost, "the purged execution cannot complete")

		code, stdout, stderr = runAPI(t, env, "keys", "show", "acct_k", "nothing")
		require.Equal(t, 0, code, stderr)
		require.Contains(t, stdout, `"postgres": null`)
		code, stdout, stderr = runAPI(t, env, "keys", "purge", "acct_k", "nothing")
		oncetest.RequireOneLineError(t, code, stdout, stderr, "no such key")
		code, stdout, stderr = runAPI(t, env, "keys", "drop", "acct_k", "x")
		oncetest.RequireOneLineError(t, code, stdout, stderr, `unknown command "drop"`)
		code, stdout, stderr = runAPI(t, env, "keys", "show", "acct_k")
		oncetest.RequireOneLineError(t, code, stdout, stderr, "SCOPE KEY")
	})
}

func TestProbe(t *testing.T) {
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer ok.Close()
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer down.Close()
	code, _, stderr := runAPI(t, nil, "probe", ok.URL)
	require.Equal(t, 0, code, stderr)
	code, stdout, stderr := runAPI(t, nil, "probe", down.URL)
	oncetest.RequireOneLineError(t, code, stdout, stderr, "answered 503")
	code, stdout, stderr = runAPI(t, nil, "probe")
	oncetest.RequireOneLineError(t, code, stdout, stderr, "say one URL")
}

func TestConfigurationIsDocumented(t *testing.T) {
	oncetest.RequireDocumented(t, run)
}

// TestReadinessWithoutRedis: Redis, or one master of a cluster, going away
// makes the api degraded, not unready — it goes on answering from Postgres,
// so a load balancer must keep it in rotation.
func TestReadinessWithoutRedis(t *testing.T) {
	t.Parallel() // waits on processes and leases more than it computes
	bin := binary(t, ".")
	for _, target := range []string{"single", "cluster"} {
		t.Run(target, func(t *testing.T) {
			t.Parallel() // a Redis of its own
			var redisEnv string
			var stop func()
			if target == "cluster" {
				c := oncetest.NewRedisCluster(t)
				redisEnv, stop = "REDIS_CLUSTER_URL="+c.URL(), c.Nodes[2].Stop
			} else {
				srv := oncetest.NewRedisServer(t)
				redisEnv, stop = "REDIS_URL="+srv.URL(), srv.Stop
			}
			addr := oncetest.FreeAddr(t)
			cmd := exec.CommandContext(t.Context(), bin)
			cmd.Env = append(os.Environ(), "DATABASE_URL="+oncetest.DatabaseURL(t), redisEnv, "HTTP_ADDR="+addr, "LOG_LEVEL=error")
			require.NoError(t, cmd.Start())
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			oncetest.WaitReady(t, addr)

			readyz := func() (int, string) {
				req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+addr+"/readyz", nil)
				require.NoError(t, err)
				res, err := http.DefaultClient.Do(req)
				require.NoError(t, err)
				defer res.Body.Close()
				body, err := io.ReadAll(res.Body)
				require.NoError(t, err)
				return res.StatusCode, string(body)
			}
			code, body := readyz()
			require.Equal(t, http.StatusOK, code)
			require.Contains(t, body, `"status":"ready"`)

			stop()
			code, body = readyz()
			require.Equal(t, http.StatusOK, code, body)
			require.Contains(t, body, `"status":"degraded"`)
			require.Contains(t, body, `"postgres":"ok"`)
			require.NotContains(t, body, `"redis":"ok"`)

			for i := range 5 { // and it serves: first executions and replays, from Postgres where needed
				key := fmt.Sprintf("degraded-%s-%d", target, i)
				for range 2 {
					req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+addr+"/v1/payments",
						strings.NewReader(`{"amount":5,"currency":"eur","customer":"c","source":"tok_visa"}`))
					require.NoError(t, err)
					req.Header.Set("Authorization", "Bearer sk_test_demo")
					req.Header.Set("Idempotency-Key", key)
					req.Header.Set("Content-Type", "application/json")
					res, err := http.DefaultClient.Do(req)
					require.NoError(t, err)
					res.Body.Close()
					require.Equal(t, http.StatusCreated, res.StatusCode)
				}
			}
		})
	}
}
