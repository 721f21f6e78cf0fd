package migrations_test

import (
	"context"
	"io/fs"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/internal/schemaver"
	"github.com/onceonly/onceonly/migrations"
	"github.com/onceonly/onceonly/oncetest"
)

// appMigrations are an application's own goose migrations, numbered as
// goose numbers them by default or sequentially (goose create -s).
func appMigrations(versions ...string) fs.FS {
	fsys := fstest.MapFS{}
	for _, v := range versions {
		fsys[v+"_app.sql"] = &fstest.MapFile{Data: []byte("-- +goose Up\nCREATE TABLE app_" + v + " (id int);\n-- +goose Down\nDROP TABLE app_" + v + ";\n")}
	}
	return fsys
}

// gooseUp runs the migrations of fsys as goose does by default: recorded
// in goose_db_version. It is how an application migrates its own schema,
// and how the engine's migrations were recorded before VersionTable.
func gooseUp(t *testing.T, pool *pgxpool.Pool, fsys fs.FS) int {
	t.Helper()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, fsys, goose.WithDisableGlobalRegistry(true))
	require.NoError(t, err)
	res, err := p.Up(oncetest.Context(t))
	require.NoError(t, err)
	return len(res)
}

// previousRelease is the engine's migrations up to version 9, the last
// one of the release before VersionTable.
func previousRelease(t *testing.T) fs.FS {
	t.Helper()
	fsys := fstest.MapFS{}
	entries, err := fs.ReadDir(migrations.FS(), ".")
	require.NoError(t, err)
	for _, e := range entries {
		v, err := strconv.Atoi(strings.SplitN(e.Name(), "_", 2)[0])
		require.NoError(t, err)
		if v > 9 {
			continue
		}
		b, err := fs.ReadFile(migrations.FS(), e.Name())
		require.NoError(t, err)
		fsys[e.Name()] = &fstest.MapFile{Data: b}
	}
	require.Len(t, fsys, 9)
	return fsys
}

func versions(t *testing.T, pool *pgxpool.Pool, table string) []int64 {
	t.Helper()
	rows, err := pool.Query(oncetest.Context(t), `SELECT version_id FROM `+table+` ORDER BY version_id`)
	require.NoError(t, err)
	var vs []int64
	for rows.Next() {
		var v int64
		require.NoError(t, rows.Scan(&v))
		vs = append(vs, v)
	}
	require.NoError(t, rows.Err())
	return vs
}

func upTo(n int64) []int64 {
	vs := []int64{0}
	for v := int64(1); v <= n; v++ {
		vs = append(vs, v)
	}
	return vs
}

// The last embedded migration is the version onceonly.New requires.
func TestLatestIsTheLastEmbeddedMigration(t *testing.T) {
	t.Parallel()
	entries, err := fs.ReadDir(migrations.FS(), ".")
	require.NoError(t, err)
	last, err := strconv.ParseInt(strings.SplitN(entries[len(entries)-1].Name(), "_", 2)[0], 10, 64)
	require.NoError(t, err)
	require.Equal(t, schemaver.Latest, last, "a new migration raises schemaver.Latest")
}

// An application's own goose migrations, in goose's default table, and
// the engine's never count as each other's, whichever run first.
func TestApplicationGooseMigrationsAreNotTheEngines(t *testing.T) {
	t.Parallel()
	ctx := oncetest.Context(t)

	// The application first: its versions 1 and 2 must not hide the
	// engine's 1 and 2.
	pool := oncetest.Pool(t, oncetest.EmptyDatabaseURL(t))
	require.Equal(t, 2, gooseUp(t, pool, appMigrations("00001", "00002")))
	n, err := migrations.Up(ctx, pool)
	require.NoError(t, err)
	require.EqualValues(t, schemaver.Latest, n, "every engine migration ran")
	require.NoError(t, migrations.EnsureCurrent(ctx, pool))
	require.Equal(t, []int64{0, 1, 2}, versions(t, pool, "goose_db_version"), "the application's table is its own")

	// The engine first: the application's migrations all run.
	pool = oncetest.Pool(t, oncetest.EmptyDatabaseURL(t))
	_, err = migrations.Up(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, 3, gooseUp(t, pool, appMigrations("00001", "00002", "00003")))
	require.Equal(t, upTo(schemaver.Latest), versions(t, pool, migrations.VersionTable))
}

// A database the previous release migrated (versions 1–9 in
// goose_db_version): Up takes its versions over, runs only what came
// since, and leaves goose_db_version with no version of the engine's; a
// second Up does nothing.
func TestUpgradeFromGooseDBVersion(t *testing.T) {
	t.Parallel()
	ctx := oncetest.Context(t)
	pool := oncetest.Pool(t, oncetest.EmptyDatabaseURL(t))
	require.Equal(t, 9, gooseUp(t, pool, previousRelease(t)))
	require.ErrorIs(t, migrations.EnsureCurrent(ctx, pool), migrations.ErrSchemaBehind)
	require.ErrorContains(t, migrations.EnsureCurrent(ctx, pool), "migrations.Up moves them")

	n, err := migrations.Up(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, int(schemaver.Latest)-9, n, "only the migrations since the previous release ran")
	require.Equal(t, upTo(schemaver.Latest), versions(t, pool, migrations.VersionTable))
	require.Equal(t, []int64{0}, versions(t, pool, "goose_db_version"), "the engine's versions moved out")
	require.NoError(t, migrations.EnsureCurrent(ctx, pool))

	n, err = migrations.Up(ctx, pool)
	require.NoError(t, err)
	require.Zero(t, n)
}

// The previous release's versions share goose_db_version with an
// application's: Up takes the engine's over and leaves every row of
// goose_db_version where it is, the application's to sort out.
func TestUpgradeLeavesAMixedGooseDBVersionAlone(t *testing.T) {
	t.Parallel()
	ctx := oncetest.Context(t)
	pool := oncetest.Pool(t, oncetest.EmptyDatabaseURL(t))
	require.Equal(t, 9, gooseUp(t, pool, previousRelease(t)))
	require.Equal(t, 1, gooseUp(t, pool, appMigrations("20240101000000")))
	before := versions(t, pool, "goose_db_version")

	m, err := migrations.NewMigrator(pool)
	require.NoError(t, err)
	defer m.Close()
	a, err := m.Adopt(ctx)
	require.NoError(t, err)
	require.Equal(t, upTo(9)[1:], a.Versions)
	require.False(t, a.Removed)
	n, err := m.Up(ctx)
	require.NoError(t, err)
	require.Equal(t, int(schemaver.Latest)-9, n)
	require.Equal(t, before, versions(t, pool, "goose_db_version"))
	require.Equal(t, upTo(schemaver.Latest), versions(t, pool, migrations.VersionTable))
}

// Instances of this release starting at once on a database the previous
// release migrated: one takes the versions over, and the new migrations
// run once.
func TestConcurrentUpgrades(t *testing.T) {
	t.Parallel()
	ctx := oncetest.Context(t)
	url := oncetest.EmptyDatabaseURL(t)
	pool := oncetest.Pool(t, url)
	require.Equal(t, 9, gooseUp(t, pool, previousRelease(t)))
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total int
	)
	for range 4 {
		instance := oncetest.Pool(t, url) // a pool each, as instances have
		wg.Go(func() {
			n, err := migrations.Up(context.WithoutCancel(ctx), instance)
			require.NoError(t, err)
			mu.Lock()
			total += n
			mu.Unlock()
		})
	}
	wg.Wait()
	require.Equal(t, int(schemaver.Latest)-9, total)
	require.Equal(t, upTo(schemaver.Latest), versions(t, pool, migrations.VersionTable))
}
