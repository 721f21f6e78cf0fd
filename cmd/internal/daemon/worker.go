package daemon

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/cmd/internal/daemon/ops"
	"github.com/onceonly/onceonly/cmd/internal/daemon/postgres"
	"github.com/onceonly/onceonly/cmd/internal/daemon/shutdown"
)

// Worker is what a worker daemon (the relay, the reconciler) runs on: its
// Postgres pool, its Redis client and its metrics.
type Worker struct {
	Pool     *pgxpool.Pool
	Redis    redis.UniversalClient
	Registry *prometheus.Registry
	log      *slog.Logger
}

// OpenWorker connects Redis and Postgres (checking the schema) as setup
// says; Redis is required. Close releases both.
func OpenWorker(ctx context.Context, setup Setup) (*Worker, error) {
	rdb := cache.NewClient(setup.Redis)
	if rdb == nil {
		return nil, cache.ErrNoRedisURL
	}
	pool, err := postgres.Open(ctx, setup.Postgres)
	if err != nil {
		_ = rdb.Close()
		return nil, err
	}
	return &Worker{Pool: pool, Redis: rdb, Registry: ops.Registry(), log: setup.Log}, nil
}

// Close closes the pool and the Redis client.
func (w *Worker) Close() {
	w.Pool.Close()
	_ = w.Redis.Close()
}

// Run runs work — the daemon's loop — beside its ops server on addr
// (/healthz, /readyz checking Postgres and every Redis master, /metrics),
// until ctx ends; see shutdown.RunBeside.
func (w *Worker) Run(ctx context.Context, addr string, work func(context.Context) error) error {
	mux := http.NewServeMux()
	ops.Handle(mux, w.Registry, map[string]ops.Check{"postgres": w.Pool.Ping, "redis": cache.ReadyCheck(w.Redis)}, nil)
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	return shutdown.RunBeside(ctx, srv, w.log, work) // its errors name the server or are work's own
}
