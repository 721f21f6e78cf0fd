// Package postgres opens a command's Postgres pool from DATABASE_URL,
// refusing a database whose schema is behind the binary.
package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceonly/onceonly/migrations"
)

// pingTimeout bounds the first round trip of Open.
const pingTimeout = 10 * time.Second

// Parse validates a DATABASE_URL (a URL or key=value string pgx accepts)
// without connecting.
func Parse(url string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("bad configuration: DATABASE_URL: %w", err)
	}
	return cfg, nil
}

// Open connects a pool and checks that the schema is current, so a daemon
// on an outdated schema refuses to start and says how to fix it
// (migrations.ErrSchemaBehind names `api migrate up`). Each of also names
// an application's migrations (migrations.WithFiles) to check as well.
func Open(ctx context.Context, cfg *pgxpool.Config, also ...migrations.Option) (*pgxpool.Pool, error) {
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to Postgres: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to Postgres: %w", err)
	}
	for _, opts := range append([][]migrations.Option{nil}, split(also)...) {
		if err := migrations.EnsureCurrent(pctx, pool, opts...); err != nil {
			pool.Close()
			return nil, err
		}
	}
	return pool, nil
}

// split makes one migration set of each option.
func split(opts []migrations.Option) [][]migrations.Option {
	sets := make([][]migrations.Option, len(opts))
	for i, o := range opts {
		sets[i] = []migrations.Option{o}
	}
	return sets
}
