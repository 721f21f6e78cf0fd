package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/oncetest"
)

// TestThroughPgBouncer runs the api's commands with DATABASE_URL on
// PgBouncer in transaction mode (query mode exec): migrate up on an empty
// database, the api serving a payment through the gateway (itself on
// PgBouncer) and its replay, then keys show and purge.
func TestThroughPgBouncer(t *testing.T) { // not parallel: runAPI sets the environment
	api := binary(t, ".")
	gw := binary(t, "../gateway")
	dbURL := oncetest.PgBouncerURL(t, oncetest.EmptyDatabaseURL(t), "exec")
	rdb, prefix := oncetest.Redis(t)
	env := oncetest.EnvWith(oncetest.RedisEnv(rdb, prefix), "DATABASE_URL", dbURL)

	code, stdout, stderr := runAPI(t, env, "migrate", "up")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, fmt.Sprintf("applied %d migration(s)", migrationCount(t)))

	g := oncetest.StartDaemon(t, gw, "DATABASE_URL="+dbURL)
	a := oncetest.StartDaemon(t, api, "DATABASE_URL="+dbURL, "REDIS_URL="+env["REDIS_URL"], "REDIS_PREFIX="+prefix,
		"GATEWAY_URL=http://"+g.Addr)
	const body = `{"amount":500,"currency":"usd","customer":"cus_b","source":"tok_visa"}`
	ctx := oncetest.Context(t)
	status, first, _ := payOnce(ctx, a.Addr, "bounced-1", body)
	require.Equal(t, http.StatusCreated, status, first)
	status, again, header := payOnce(ctx, a.Addr, "bounced-1", body)
	require.Equal(t, http.StatusCreated, status, again)
	require.Equal(t, "true", header.Get("Idempotent-Replayed"))
	require.JSONEq(t, first, again)

	var view keyView
	code, stdout, stderr = runAPI(t, env, "keys", "show", "acct_demo", "bounced-1")
	require.Equal(t, 0, code, stderr)
	require.NoError(t, json.Unmarshal([]byte(stdout), &view))
	require.Equal(t, "completed", view.Postgres.Status)
	require.True(t, *view.InSync)
	code, stdout, stderr = runAPI(t, env, "keys", "purge", "acct_demo", "bounced-1")
	require.Equal(t, 0, code, stderr)
	require.NoError(t, json.Unmarshal([]byte(stdout), &view))
	require.LessOrEqual(t, view.Postgres.ExpiresInMs, int64(0))
	require.NotContains(t, a.Logs.String()+g.Logs.String(), "level=ERROR")
}
