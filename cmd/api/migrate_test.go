package main

import (
	"context"
	"fmt"
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/demo/payments/schema"
	"github.com/onceonly/onceonly/migrations"
	"github.com/onceonly/onceonly/oncetest"
)

// gooseLockID is goose's default lock id, the previous release's.
const gooseLockID = 5887940537704921958

// TestMigrateTakesOverAnEarlierRelease: on a database the previous release
// migrated (the engine's versions 1–9 in goose_db_version, the demo's in
// its own table), `api migrate up` takes the engine's versions over and
// runs only what came since; status, down and version see them.
func TestMigrateTakesOverAnEarlierRelease(t *testing.T) {
	url := oncetest.EmptyDatabaseURL(t)
	pool := oncetest.Pool(t, url)
	ctx := oncetest.Context(t)
	previous := fstest.MapFS{}
	for _, name := range migrationFiles(t)[:9] {
		b, err := fs.ReadFile(migrations.FS(), name)
		require.NoError(t, err)
		previous[name] = &fstest.MapFile{Data: b}
	}
	for _, opt := range []migrations.Option{migrations.WithFiles(previous, "goose_db_version", "goose_lock", gooseLockID), schema.Migrations()} {
		m, err := migrations.NewMigrator(pool, opt)
		require.NoError(t, err)
		_, err = m.Up(ctx)
		require.NoError(t, m.Close())
		require.NoError(t, err)
	}
	env := map[string]string{"DATABASE_URL": url}
	n := migrationCount(t)

	code, stdout, stderr := runAPI(t, env, "migrate", "up")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "took over versions 1-9 of the engine from goose_db_version into onceonly_db_version (and removed them there)")
	require.Contains(t, stdout, fmt.Sprintf("applied %d migration(s); schema at version %d", n-9, n))
	require.Contains(t, stdout, "demo schema: applied 0 migration(s)")
	require.NoError(t, migrations.EnsureCurrent(context.WithoutCancel(ctx), pool))

	code, stdout, _ = runAPI(t, env, "migrate", "status")
	require.Equal(t, 0, code)
	require.Equal(t, n+2, strings.Count(stdout, "applied"), stdout)
	require.NotContains(t, stdout, "took over", "once is enough")

	code, stdout, _ = runAPI(t, env, "migrate", "down")
	require.Equal(t, 0, code)
	require.Contains(t, stdout, migrationFiles(t)[n-1])
	code, stdout, _ = runAPI(t, env, "migrate", "version")
	require.Equal(t, 0, code)
	require.Equal(t, fmt.Sprintf("%d\n", n-1), stdout)
}
