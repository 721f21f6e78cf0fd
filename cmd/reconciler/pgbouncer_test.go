package main

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/oncetest"
	"github.com/onceonly/onceonly/outbox"
	"github.com/onceonly/onceonly/reconcile"
)

// TestOnceThroughPgBouncer runs `reconciler --once` three times with
// DATABASE_URL on PgBouncer in transaction mode: every pass runs (none is
// skipped for a lock a pass before left on a pooled server connection), and
// the first reaps, expires and repairs.
func TestOnceThroughPgBouncer(t *testing.T) {
	dbURL := oncetest.DatabaseURL(t)
	rdb, prefix := oncetest.Redis(t)
	ctx := oncetest.Context(t)
	pool := oncetest.Pool(t, dbURL)
	store := outbox.New(outbox.Config{})
	for _, key := range []string{"a", "b", "c"} {
		_, err := store.Claim(ctx, pool, keystate.Ref{Scope: "s", Key: key}, "v1:fp", keystate.Owner{1}, time.Minute)
		require.NoError(t, err)
	}
	_, err := pool.Exec(ctx, `UPDATE idempotency_keys SET lease_expires_at = now() - interval '1 minute' WHERE key = 'a'`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE idempotency_keys SET expires_at = now() - interval '1 minute' WHERE key = 'b'`)
	require.NoError(t, err)

	env := oncetest.EnvWith(oncetest.RedisEnv(rdb, prefix), "DATABASE_URL", oncetest.PgBouncerURL(t, dbURL, "exec"))
	for i := range 3 {
		code, stdout, stderr := oncetest.RunMain(t, run, env, "--once")
		require.Equal(t, 0, code, stderr)
		var rep reconcile.Report
		require.NoError(t, json.Unmarshal([]byte(stdout), &rep))
		require.False(t, rep.Skipped, "pass %d", i+1)
		require.EqualValues(t, 2, rep.Scanned, "pass %d", i+1)
		if i == 0 {
			require.EqualValues(t, 1, rep.LeasesReaped)
			require.EqualValues(t, 1, rep.ExpiredDeleted)
			require.EqualValues(t, 2, rep.Repaired)
		} else {
			require.EqualValues(t, 2, rep.InSync)
		}
	}
}
