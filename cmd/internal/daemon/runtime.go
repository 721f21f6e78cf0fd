package daemon

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/cmd/internal/daemon/ops"
	"github.com/onceonly/onceonly/cmd/internal/daemon/postgres"
	"github.com/onceonly/onceonly/migrations"
)

// Runtime is what a command that runs handlers (the api, the consumer)
// runs them on: its Postgres pool, its Redis client, its metrics and the
// engine on them.
type Runtime struct {
	Pool *pgxpool.Pool
	// Redis is nil when setup has none (Setup.Redis nil): the engine runs
	// from Postgres alone.
	Redis    redis.UniversalClient
	Registry *prometheus.Registry
	Engine   *onceonly.Engine
}

// RuntimeOptions are what the commands that open a Runtime set apart.
type RuntimeOptions struct {
	// MinConns is the least size of the Postgres pool (DATABASE_URL's
	// pool_max_conns may make it larger).
	MinConns int32
	// Schema, when set, names the command's own migrations, checked
	// current beside the engine's (see postgres.Open).
	Schema migrations.Option
	// Configure, when set, completes the engine's configuration (Tuning,
	// Daemons) before the engine is built.
	Configure func(*onceonly.Config)
}

// OpenRuntime connects Redis when setup has it and Postgres (checking the
// schema), and builds the engine of e's settings on them, with c's Redis
// prefix and layout, setup's logger and the Runtime's registry. Close
// releases what it opened.
func OpenRuntime(ctx context.Context, setup Setup, c *Common, e *Engine, opts RuntimeOptions) (*Runtime, error) {
	rt := &Runtime{Redis: cache.NewClient(setup.Redis), Registry: ops.Registry()}
	pgCfg := setup.Postgres.Copy()
	pgCfg.MaxConns = max(pgCfg.MaxConns, opts.MinConns)
	var schema []migrations.Option
	if opts.Schema != nil {
		schema = append(schema, opts.Schema)
	}
	var err error
	if rt.Pool, err = postgres.Open(ctx, pgCfg, schema...); err != nil {
		rt.Close()
		return nil, err
	}
	cfg := e.Config()
	cfg.Pool, cfg.Redis, cfg.RedisPrefix, cfg.Logger, cfg.Registerer = rt.Pool, rt.Redis, *c.RedisPrefix, setup.Log, rt.Registry
	cfg.Tuning = onceonly.Tuning{RedisWriteLayout1: *c.RedisWriteLayout1}
	if opts.Configure != nil {
		opts.Configure(&cfg)
	}
	if rt.Engine, err = onceonly.New(cfg); err != nil {
		rt.Close()
		return nil, err
	}
	return rt, nil
}

// Close closes the engine, the pool and the Redis client, those it has.
func (rt *Runtime) Close() {
	if rt.Engine != nil {
		rt.Engine.Close()
	}
	if rt.Pool != nil {
		rt.Pool.Close()
	}
	if rt.Redis != nil {
		_ = rt.Redis.Close()
	}
}
