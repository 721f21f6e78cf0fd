package postgres_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/cmd/internal/daemon/postgres"
	"github.com/onceonly/onceonly/migrations"
	"github.com/onceonly/onceonly/oncetest"
)

func TestParse(t *testing.T) {
	cfg, err := postgres.Parse("postgres://u@db.example:6543/app?sslmode=disable&pool_max_conns=7")
	require.NoError(t, err)
	require.Equal(t, "db.example", cfg.ConnConfig.Host)
	require.EqualValues(t, 6543, cfg.ConnConfig.Port)
	require.Equal(t, "app", cfg.ConnConfig.Database)
	require.EqualValues(t, 7, cfg.MaxConns)

	cfg, err = postgres.Parse("host=db.example dbname=app sslmode=disable")
	require.NoError(t, err, "the key=value form")
	require.Equal(t, "app", cfg.ConnConfig.Database)

	for _, bad := range []string{"postgres://u@h:notaport/db", "postgres://h/db?pool_max_conns=many"} {
		_, err := postgres.Parse(bad)
		require.ErrorContains(t, err, "bad configuration: DATABASE_URL: ", bad)
	}
}

func TestOpen(t *testing.T) {
	cfg, err := postgres.Parse(oncetest.DatabaseURL(t))
	require.NoError(t, err)
	pool, err := postgres.Open(t.Context(), cfg)
	require.NoError(t, err)
	defer pool.Close()
	require.NoError(t, pool.Ping(t.Context()))
}

// TestOpenRefusesASchemaBehind: on a database never migrated, Open fails and
// names the command that fixes it.
func TestOpenRefusesASchemaBehind(t *testing.T) {
	cfg, err := postgres.Parse(oncetest.EmptyDatabaseURL(t))
	require.NoError(t, err)
	_, err = postgres.Open(t.Context(), cfg)
	require.ErrorIs(t, err, migrations.ErrSchemaBehind)
	require.ErrorContains(t, err, "api migrate up")
}

func TestOpenUnreachable(t *testing.T) {
	cfg, err := postgres.Parse("postgres://postgres@" + oncetest.FreeAddr(t) + "/postgres?sslmode=disable&connect_timeout=2")
	require.NoError(t, err)
	_, err = postgres.Open(t.Context(), cfg)
	require.ErrorContains(t, err, "connect to Postgres: ")
}
