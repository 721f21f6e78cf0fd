// Package daemon is what the commands (api, relay, reconciler, gateway)
// share, one job per file or sub-package:
//
//   - settings.go: the settings every command with Redis shares (DATABASE_URL,
//     REDIS_*, HTTP_ADDR, LOG_*), their validation into a Setup, and
//     argument parsing with one-line errors;
//   - worker.go: the Postgres pool, Redis client and metrics a worker daemon
//     (the relay, the reconciler) runs on, and running it beside its ops
//     server;
//   - runtime.go: the Postgres pool, Redis client, metrics and engine a
//     command that runs handlers (the api, the consumer) runs them on;
//   - logger: the slog logger of LOG_LEVEL and LOG_FORMAT;
//   - postgres: DATABASE_URL parsed, and a pool opened on a current schema;
//   - redisconn: the Redis client of REDIS_URL, REDIS_CLUSTER_URL or
//     REDIS_SENTINEL_URL, failing fast, and its readiness check;
//   - ops: /healthz, /readyz and /metrics;
//   - shutdown: SIGINT and SIGTERM, and the graceful stop of a server and
//     the work beside it.
//
// Tracing (OTEL_*) is package internal/tracing.
package daemon
