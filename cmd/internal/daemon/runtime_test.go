package daemon_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/cmd/internal/daemon"
	"github.com/onceonly/onceonly/migrations"
	"github.com/onceonly/onceonly/oncetest"
)

// TestOpenRuntime: the pool has at least MinConns connections (setup's
// configuration is left as it was), Configure completes the engine's
// configuration, and without Redis the engine runs from Postgres alone;
// on a schema behind, nothing opens.
func TestOpenRuntime(t *testing.T) {
	set, c, _ := define(t, nil)
	e := daemon.DefineEngine(set, "test")
	require.NoError(t, set.Parse(nil))
	s := workerSetup(t, oncetest.DatabaseURL(t))
	s.Postgres.MaxConns = 4
	configured := false
	rt, err := daemon.OpenRuntime(t.Context(), s, c, e, daemon.RuntimeOptions{
		MinConns: 7,
		Configure: func(cfg *onceonly.Config) {
			configured = cfg.Pool != nil && cfg.Redis != nil && cfg.LeaseTimeout == *e.LeaseTimeout
		},
	})
	require.NoError(t, err)
	defer rt.Close()
	require.True(t, configured)
	require.EqualValues(t, 7, rt.Pool.Config().MaxConns)
	require.EqualValues(t, 4, s.Postgres.MaxConns)
	require.NoError(t, rt.Redis.Ping(t.Context()).Err())
	require.NotNil(t, rt.Engine)

	s.Redis = nil
	noRedis, err := daemon.OpenRuntime(t.Context(), s, c, e, daemon.RuntimeOptions{})
	require.NoError(t, err)
	defer noRedis.Close()
	require.Nil(t, noRedis.Redis)
	require.EqualValues(t, 4, noRedis.Pool.Config().MaxConns)

	_, err = daemon.OpenRuntime(t.Context(), workerSetup(t, oncetest.EmptyDatabaseURL(t)), c, e, daemon.RuntimeOptions{})
	require.ErrorIs(t, err, migrations.ErrSchemaBehind)
}
