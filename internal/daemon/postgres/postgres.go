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
// (migrations.ErrSchemaBehind names `api migrate up`).
func Open(ctx context.Context, cfg *pgxpool.Config) (*pgxpool.Pool, error) {
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
	if err := migrations.EnsureCurrent(pctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}
