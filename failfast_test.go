package onceonly_test

import (
	"context"
	"database/sql"
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/migrations"
	"github.com/onceonly/onceonly/oncetest"
)

// New refuses a database without the schema, or with one behind this
// release, and names the fix; it reads the version once, so a current
// schema costs one statement.
func TestNewRefusesAMissingOrOldSchema(t *testing.T) {
	t.Parallel()
	ctx := oncetest.Context(t)
	quiet := oncetest.QuietLogger()

	empty := oncetest.Pool(t, oncetest.EmptyDatabaseURL(t))
	_, err := onceonly.New(onceonly.Config{Pool: empty, Logger: quiet})
	require.ErrorIs(t, err, onceonly.ErrSchemaBehind)
	require.ErrorIs(t, err, migrations.ErrSchemaBehind, "one error, whichever package names it")
	require.ErrorContains(t, err, "run migrations.Up(ctx, pool) before onceonly.New, or `api migrate up`")
	require.ErrorContains(t, err, "the database has no onceonly schema")

	e, err := onceonly.New(onceonly.Config{Pool: empty, Logger: quiet, Tuning: onceonly.Tuning{NoSchemaCheck: true}})
	require.NoError(t, err, "the check can be skipped")
	e.Close()

	pool := oncetest.DB(t)
	e, err = onceonly.New(onceonly.Config{Pool: pool, Logger: quiet})
	require.NoError(t, err)
	e.Close()
	_, err = pool.Exec(ctx, `DELETE FROM `+migrations.VersionTable+` WHERE version_id = (SELECT max(version_id) FROM `+migrations.VersionTable+`)`)
	require.NoError(t, err)
	_, err = onceonly.New(onceonly.Config{Pool: pool, Logger: quiet})
	require.ErrorIs(t, err, onceonly.ErrSchemaBehind)
	require.ErrorContains(t, err, "database at version 9, this release needs 10")
}

// New on a Postgres that does not answer says so (ErrUnavailable), at once.
func TestNewWithoutPostgres(t *testing.T) {
	t.Parallel()
	pool := oncetest.Pool(t, "postgres://postgres@127.0.0.1:1/x?connect_timeout=2")
	_, err := onceonly.New(onceonly.Config{Pool: pool, Logger: oncetest.QuietLogger()})
	require.ErrorIs(t, err, onceonly.ErrUnavailable)
	require.NotErrorIs(t, err, onceonly.ErrSchemaBehind)
}

// The engine's schema gone after New (rolled back, dropped): an execution
// returns ErrSchemaBehind, which names the fix, not ErrUnavailable; a
// handler's own missing table is still the handler's error.
func TestExecutionOnAMissingSchema(t *testing.T) {
	t.Parallel()
	ctx := oncetest.Context(t)
	for _, twoPhase := range []bool{false, true} {
		for _, ranBefore := range []bool{false, true} {
			pool := oncetest.DB(t)
			e, err := onceonly.New(onceonly.Config{Pool: pool, TwoPhase: twoPhase, Logger: oncetest.QuietLogger()})
			require.NoError(t, err)
			t.Cleanup(e.Close)
			if ranBefore {
				_, err = e.Do(ctx, "s", "k0", nil, func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
					_, err := tx.Exec(ctx, `INSERT INTO no_such_table VALUES (1)`)
					return onceonly.Result{}, err
				})
				require.Error(t, err)
				require.NotErrorIs(t, err, onceonly.ErrSchemaBehind, "the application's table, not the engine's")
			}

			_, err = pool.Exec(ctx, `DROP TABLE idempotency_keys CASCADE`)
			require.NoError(t, err)
			ran := false
			_, err = e.Do(ctx, "s", "k1", nil, func(context.Context, pgx.Tx) (onceonly.Result, error) {
				ran = true
				return onceonly.Result{Status: 201}, nil
			})
			require.ErrorIs(t, err, onceonly.ErrSchemaBehind, "two-phase %v, ran before %v", twoPhase, ranBefore)
			require.ErrorContains(t, err, "api migrate up")
			require.False(t, ran)
			s := onceonly.Settle(onceonly.Outcome{}, err)
			require.Equal(t, onceonly.Retry, s.Disposition, "never dead-lettered: the message is fine")

			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			_, err = e.DoTx(ctx, tx, "s", "k2", nil, func(context.Context, pgx.Tx) (onceonly.Result, error) {
				return onceonly.Result{Status: 201}, nil
			})
			require.ErrorIs(t, err, onceonly.ErrSchemaBehind, "DoTx")
			require.NoError(t, tx.Rollback(ctx))
		}
	}
}

// Middleware without Scope panics when it is built, with the fix, not at
// the first request (a nil func call inside net/http).
func TestMiddlewareWithoutScopeRefusesAtConstruction(t *testing.T) {
	t.Parallel()
	e, err := onceonly.New(onceonly.Config{Pool: oncetest.DB(t), Logger: oncetest.QuietLogger()})
	require.NoError(t, err)
	t.Cleanup(e.Close)
	require.PanicsWithValue(t, "onceonly: MiddlewareOptions.Scope is required: a func(r *http.Request) (string, error) returning the request's tenant "+
		"(merchant, user) whose keys must never meet another's, e.g. the account of its API key; a service with one tenant returns a constant",
		func() { e.Middleware(onceonly.MiddlewareOptions{}) })
	require.NotPanics(t, func() {
		e.Middleware(onceonly.MiddlewareOptions{Scope: func(*http.Request) (string, error) { return "tenant", nil }})
	})
}

// An Engine New did not make answers ErrNotMade (the middleware panics
// with it), instead of a nil-pointer panic; Close and Stop do nothing.
func TestZeroEngine(t *testing.T) {
	t.Parallel()
	ctx := oncetest.Context(t)
	handler := func(context.Context, pgx.Tx) (onceonly.Result, error) { return onceonly.Result{}, nil }
	for name, e := range map[string]*onceonly.Engine{"zero": {}, "nil": nil} {
		_, err := e.Do(ctx, "s", "k", nil, handler)
		require.ErrorIs(t, err, onceonly.ErrNotMade, name)
		_, err = e.Run(ctx, "f", "s", "k", nil)
		require.ErrorIs(t, err, onceonly.ErrNotMade, name)
		_, err = e.DoSQL(ctx, "s", "k", nil, func(context.Context, *sql.Tx) (onceonly.Result, error) { return onceonly.Result{}, nil })
		require.ErrorIs(t, err, onceonly.ErrNotMade, name)
		require.ErrorIs(t, e.Register("f", func(context.Context, *onceonly.Execution) (onceonly.Result, error) { return onceonly.Result{}, nil }), onceonly.ErrNotMade, name)
		require.ErrorIs(t, e.Start(ctx), onceonly.ErrNotMade, name)
		require.ErrorIs(t, e.Resume(ctx), onceonly.ErrNotMade, name)
		_, err = e.Inspect(ctx, "s", "k")
		require.ErrorIs(t, err, onceonly.ErrNotMade, name)
		require.ErrorIs(t, e.Purge(ctx, "s", "k", false), onceonly.ErrNotMade, name)
		require.PanicsWithError(t, onceonly.ErrNotMade.Error(), func() {
			e.Middleware(onceonly.MiddlewareOptions{Scope: func(*http.Request) (string, error) { return "tenant", nil }})
		}, name)
		require.NotPanics(t, e.Close, name)
		require.NoError(t, e.Stop(ctx), name)
	}
}

// Do, DoTx and the database/sql forms without a handler, or without the
// caller's transaction, return an error and leave no key behind.
func TestNilHandlerOrTx(t *testing.T) {
	t.Parallel()
	ctx := oncetest.Context(t)
	pool := oncetest.DB(t)
	e, err := onceonly.New(onceonly.Config{Pool: pool, Logger: oncetest.QuietLogger()})
	require.NoError(t, err)
	t.Cleanup(e.Close)
	_, err = e.Do(ctx, "s", "k", nil, nil)
	require.ErrorContains(t, err, "the handler is nil")
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // the test's transaction
	_, err = e.DoTx(ctx, tx, "s", "k", nil, nil)
	require.ErrorContains(t, err, "the handler is nil")
	_, err = e.DoTx(ctx, nil, "s", "k", nil, func(context.Context, pgx.Tx) (onceonly.Result, error) { return onceonly.Result{}, nil })
	require.ErrorContains(t, err, "need the caller's transaction")
	_, err = e.DoSQLTx(ctx, nil, "s", "k", nil, func(context.Context, *sql.Tx) (onceonly.Result, error) { return onceonly.Result{}, nil })
	require.ErrorContains(t, err, "need the caller's transaction")
	var keys int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys`).Scan(&keys))
	require.Zero(t, keys)
}

// A Config.Redis that holds a nil client (var rdb *redis.Client left
// unset) is refused by New, not met on the first request.
func TestNewRefusesANilRedisClient(t *testing.T) {
	t.Parallel()
	var rdb *redis.Client
	_, err := onceonly.New(onceonly.Config{Pool: oncetest.DB(t), Redis: rdb, Logger: oncetest.QuietLogger()})
	require.ErrorContains(t, err, "leave Config.Redis unset to run without Redis")
}
