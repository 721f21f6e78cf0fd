// Package daemon holds what the three commands share: logging, the Postgres
// and Redis clients built from configuration, the ops HTTP server (/healthz,
// /readyz, /metrics) and signal handling.
package daemon

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"

	"github.com/onceonly/onceonly/internal/cache"
	"github.com/onceonly/onceonly/internal/config"
	"github.com/onceonly/onceonly/internal/tracing"
	"github.com/onceonly/onceonly/migrations"
)

// Logger returns a slog logger writing to w in format ("json" or "text") at
// level ("debug", "info", "warn", "error").
func Logger(w io.Writer, level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("bad configuration: LOG_LEVEL=%q: use debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: l}
	switch strings.ToLower(format) {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("bad configuration: LOG_FORMAT=%q: use json or text", format)
}

// SignalContext returns a context canceled on SIGINT or SIGTERM.
func SignalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// ParsePostgres validates a DATABASE_URL without connecting.
func ParsePostgres(url string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("bad configuration: DATABASE_URL: %w", err)
	}
	return cfg, nil
}

// OpenPostgres connects a pool and checks that the schema is current, so a
// daemon on an outdated schema refuses to start and says how to fix it.
func OpenPostgres(ctx context.Context, cfg *pgxpool.Config) (*pgxpool.Pool, error) {
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to Postgres: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
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

// RedisOptions validates REDIS_URL / REDIS_CLUSTER_URL (exactly one) and
// returns universal client options: redis.NewUniversalClient makes a
// cluster client of the second, whose pipelines it splits per node.
//
// A cache must fail fast: when a server (or one master) is unreachable, the
// api answers from Postgres and the relay defers that node's keys, so a
// failed dial is retried once after 10ms rather than go-redis's default of
// five times 100ms, and every call is bounded by one-second timeouts.
func RedisOptions(url, clusterURL string) (*redis.UniversalOptions, error) {
	var o *redis.UniversalOptions
	switch {
	case url != "" && clusterURL != "":
		return nil, errors.New("bad configuration: set REDIS_URL or REDIS_CLUSTER_URL, not both")
	case clusterURL != "":
		c, err := redis.ParseClusterURL(clusterURL)
		if err != nil {
			return nil, fmt.Errorf("bad configuration: REDIS_CLUSTER_URL: %w", err)
		}
		o = &redis.UniversalOptions{Addrs: c.Addrs, Username: c.Username, Password: c.Password,
			TLSConfig: c.TLSConfig, IsClusterMode: true, PoolSize: c.PoolSize}
	case url != "":
		c, err := redis.ParseURL(url)
		if err != nil {
			return nil, fmt.Errorf("bad configuration: REDIS_URL: %w", err)
		}
		o = &redis.UniversalOptions{Addrs: []string{c.Addr}, Username: c.Username, Password: c.Password,
			DB: c.DB, TLSConfig: c.TLSConfig, PoolSize: c.PoolSize}
	default:
		return nil, errors.New("bad configuration: REDIS_URL (or REDIS_CLUSTER_URL or REDIS_SENTINEL_URL) is required")
	}
	failFast(o)
	return o, nil
}

// failFast bounds every call and dial of a client made from o (see
// RedisOptions).
func failFast(o *redis.UniversalOptions) {
	o.DialTimeout, o.ReadTimeout, o.WriteTimeout = time.Second, time.Second, time.Second
	o.DialerRetries, o.DialerRetryTimeout = 1, 10*time.Millisecond
}

// RedisSentinelOptions validates a REDIS_SENTINEL_URL (go-redis failover
// form: redis://[user:pass@]sentinel:port?master_name=NAME&addr=sentinel2:port…,
// where user:pass are the Sentinels' credentials and password= the
// master's) and returns universal client options for a failover client:
// every connection asks the Sentinels for the current master, so the
// command follows a failover. Calls fail fast as in RedisOptions.
func RedisSentinelOptions(url string) (*redis.UniversalOptions, error) {
	c, err := redis.ParseFailoverURL(url)
	if err != nil {
		return nil, fmt.Errorf("bad configuration: REDIS_SENTINEL_URL: %w", err)
	}
	if c.MasterName == "" {
		return nil, errors.New("bad configuration: REDIS_SENTINEL_URL: master_name is required (redis://sentinel:26379?master_name=NAME&addr=…)")
	}
	o := &redis.UniversalOptions{Addrs: c.SentinelAddrs, MasterName: c.MasterName,
		SentinelUsername: c.SentinelUsername, SentinelPassword: c.SentinelPassword,
		Username: c.Username, Password: c.Password, DB: c.DB, TLSConfig: c.TLSConfig, PoolSize: c.PoolSize}
	failFast(o)
	return o, nil
}

// Registry returns a Prometheus registry with the Go and process collectors.
func Registry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Check is one readiness check.
type Check func(ctx context.Context) error

// OpsHandler serves /healthz (the process is up), /readyz and /metrics, on
// mux. /readyz answers 503 "not_ready" when a required check fails, and 200
// "degraded" when only optional ones do: the process still does its job,
// more slowly (the api without Redis answers from Postgres, so a load
// balancer must keep sending it traffic).
func OpsHandler(mux *http.ServeMux, reg *prometheus.Registry, required, optional map[string]Check) {
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"status":"ok"}`+"\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		status, code := "ready", http.StatusOK
		var parts []string
		run := func(checks map[string]Check, failed func()) {
			for name, check := range checks {
				if err := check(ctx); err != nil {
					failed()
					parts = append(parts, fmt.Sprintf("%q:%q", name, err.Error()))
				} else {
					parts = append(parts, fmt.Sprintf("%q:\"ok\"", name))
				}
			}
		}
		run(required, func() { status, code = "not_ready", http.StatusServiceUnavailable })
		run(optional, func() {
			if code == http.StatusOK {
				status = "degraded"
			}
		})
		slices.Sort(parts)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_, _ = fmt.Fprintf(w, `{"status":%q,"checks":{%s}}`+"\n", status, strings.Join(parts, ","))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
}

// Serve runs srv until ctx ends, then shuts it down gracefully, giving
// in-flight requests up to grace to finish.
func Serve(ctx context.Context, srv *http.Server, log *slog.Logger, grace time.Duration) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve %s: %w", srv.Addr, err)
	case <-ctx.Done():
	}
	log.Info("shutting down", "addr", srv.Addr)
	// ctx has ended: the grace period runs on a context detached from it.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shut down %s: %w", srv.Addr, err)
	}
	return nil
}

func init() { //nolint:gochecknoinits // must run before any daemon opens a client, whatever its entry point
	// go-redis logs dial failures through the standard log package, outside
	// slog; the daemons count and log Redis failures themselves.
	logging.Disable()
}

// Common is the configuration every daemon shares.
type Common struct {
	DatabaseURL, RedisURL, RedisClusterURL, RedisSentinelURL, RedisPrefix, HTTPAddr, LogLevel, LogFormat *string
	// RedisWriteLayout1: completed values are written in layout 1 (see
	// cache.Options.WriteLayout1).
	RedisWriteLayout1 *bool
}

// DefineCommon defines the shared settings on s; httpAddr is the daemon's
// default listen address.
func DefineCommon(s *config.Set, httpAddr, redisURLText string) *Common {
	return &Common{
		DatabaseURL:      s.String("database-url", "DATABASE_URL", "", "Postgres URL (required)"),
		RedisURL:         s.String("redis-url", "REDIS_URL", "", redisURLText),
		RedisClusterURL:  s.String("redis-cluster-url", "REDIS_CLUSTER_URL", "", "Redis Cluster seed nodes, go-redis form: redis://[user:pass@]h1:6379?addr=h2:6379&addr=h3:6379"),
		RedisSentinelURL: s.String("redis-sentinel-url", "REDIS_SENTINEL_URL", "", "Redis behind Sentinel, go-redis failover form: redis://[user:pass@]s1:26379?master_name=NAME&addr=s2:26379&addr=s3:26379 (user:pass for the Sentinels, password= for the master); instead of REDIS_URL"),
		RedisPrefix:      s.String("redis-prefix", "REDIS_PREFIX", cache.DefaultPrefix, "prefix of every Redis key"),
		RedisWriteLayout1: s.Bool("redis-write-layout1", "REDIS_WRITE_LAYOUT1", false,
			"write completed values in the layout releases before 2026-11-24 read: set it on every api, relay and reconciler during a rolling upgrade from one, unset it once none runs"),
		HTTPAddr:  s.String("http-addr", "HTTP_ADDR", httpAddr, "listen address of /healthz, /readyz and /metrics (and of the API, for the api)"),
		LogLevel:  s.String("log-level", "LOG_LEVEL", "info", "debug, info, warn or error"),
		LogFormat: s.String("log-format", "LOG_FORMAT", "json", "json or text"),
	}
}

// CacheOptions returns the options of the daemon's Redis cache.
func (c *Common) CacheOptions() cache.Options {
	return cache.Options{Prefix: *c.RedisPrefix, WriteLayout1: *c.RedisWriteLayout1}
}

// Setup is the shared configuration, validated.
type Setup struct {
	Log      *slog.Logger
	Postgres *pgxpool.Config
	// Redis is nil when none of REDIS_URL, REDIS_CLUSTER_URL and
	// REDIS_SENTINEL_URL is set.
	Redis *redis.UniversalOptions
	// Sentinel is true when Redis is reached through Sentinel.
	Sentinel bool
}

// Validate checks the shared settings without connecting anywhere; logs go
// to stderr.
func (c *Common) Validate(stderr io.Writer, set *config.Set, redisRequired bool) (Setup, error) {
	if err := set.Require(map[string]*string{"database-url": c.DatabaseURL}); err != nil {
		return Setup{}, err
	}
	var s Setup
	var err error
	if s.Log, err = Logger(stderr, *c.LogLevel, *c.LogFormat); err != nil {
		return Setup{}, err
	}
	if s.Postgres, err = ParsePostgres(*c.DatabaseURL); err != nil {
		return Setup{}, err
	}
	switch {
	case *c.RedisSentinelURL != "" && (*c.RedisURL != "" || *c.RedisClusterURL != ""):
		return Setup{}, errors.New("bad configuration: set one of REDIS_URL, REDIS_CLUSTER_URL and REDIS_SENTINEL_URL, not several")
	case *c.RedisSentinelURL != "":
		if s.Redis, err = RedisSentinelOptions(*c.RedisSentinelURL); err != nil {
			return Setup{}, err
		}
		s.Sentinel = true
	case redisRequired || *c.RedisURL != "" || *c.RedisClusterURL != "":
		if s.Redis, err = RedisOptions(*c.RedisURL, *c.RedisClusterURL); err != nil {
			return Setup{}, err
		}
	}
	return s, nil
}

// ParseArgs parses args on set and reports how to go on: ok false means
// return code (0 after -h).
func ParseArgs(set *config.Set, command string, args []string, stderr io.Writer) (code int, ok bool) {
	if err := set.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, false
		}
		fmt.Fprintf(stderr, "%s: %v\n", command, err)
		return 2, false
	}
	if len(set.Args()) > 0 {
		fmt.Fprintf(stderr, "%s: unexpected argument %q\n", command, set.Args()[0])
		return 2, false
	}
	return 0, true
}

// RunWithOps runs work and the ops server srv side by side until ctx ends.
// When ctx ends, work is expected to return (finishing what it holds) and
// the server shuts down gracefully. If the server cannot listen, work is
// stopped and the error returned.
func RunWithOps(ctx context.Context, srv *http.Server, log *slog.Logger, work func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	serveErr := make(chan error, 1)
	go func() {
		serveErr <- Serve(ctx, srv, log, 5*time.Second)
		cancel()
	}()
	workErr := work(ctx)
	cancel()
	if err := <-serveErr; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return workErr
}

// RedisCheck pings every server behind rdb (every master of a cluster).
func RedisCheck(rdb redis.UniversalClient) Check {
	return func(ctx context.Context) error {
		return cache.ForEachNode(ctx, rdb, func(ctx context.Context, node redis.UniversalClient) error {
			return node.Ping(ctx).Err()
		})
	}
}

// NewRedis is the one place a command makes its Redis client: a cluster
// client for REDIS_CLUSTER_URL, a single-server one for REDIS_URL (see
// RedisOptions), a failover client for REDIS_SENTINEL_URL (see
// RedisSentinelOptions), nil when opts is nil (no Redis configured).
func NewRedis(opts *redis.UniversalOptions) redis.UniversalClient {
	if opts == nil {
		return nil
	}
	return redis.NewUniversalClient(opts)
}

// Worker is what a worker daemon (the relay, the reconciler) runs on: its
// Postgres pool, its Redis client and the cache over it, and its metrics.
type Worker struct {
	Pool     *pgxpool.Pool
	Redis    redis.UniversalClient
	Cache    *cache.Cache
	Registry *prometheus.Registry
	log      *slog.Logger
}

// OpenWorker connects Redis and Postgres (checking the schema) as setup
// says, with a cache of the given options. Close releases both.
func OpenWorker(ctx context.Context, setup Setup, opts cache.Options) (*Worker, error) {
	rdb := NewRedis(setup.Redis)
	if rdb == nil {
		return nil, errors.New("bad configuration: REDIS_URL (or REDIS_CLUSTER_URL or REDIS_SENTINEL_URL) is required")
	}
	pool, err := OpenPostgres(ctx, setup.Postgres)
	if err != nil {
		_ = rdb.Close()
		return nil, err
	}
	return &Worker{
		Pool: pool, Redis: rdb, Cache: cache.New(rdb, opts),
		Registry: Registry(), log: setup.Log,
	}, nil
}

// Close closes the pool and the Redis client.
func (w *Worker) Close() {
	w.Pool.Close()
	_ = w.Redis.Close()
}

// Run runs work — the daemon's loop — beside its ops server on addr
// (/healthz, /readyz checking Postgres and every Redis master, /metrics),
// until ctx ends; see RunWithOps.
func (w *Worker) Run(ctx context.Context, addr string, work func(context.Context) error) error {
	mux := http.NewServeMux()
	OpsHandler(mux, w.Registry, map[string]Check{"postgres": w.Pool.Ping, "redis": RedisCheck(w.Redis)}, nil)
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	return RunWithOps(ctx, srv, w.log, work)
}

// StartTracing installs OpenTelemetry tracing for service from the OTEL_*
// variables (package tracing: off unless an OTLP endpoint is set). The
// returned stop flushes the spans still buffered, within five seconds.
func StartTracing(ctx context.Context, service string) (stop func(), err error) {
	shutdown, err := tracing.Setup(ctx, service)
	if err != nil {
		return func() {}, err
	}
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = shutdown(sctx)
	}, nil
}

// TraceHTTP wraps a daemon's handler in a server span per request, joining
// the caller's trace (W3C traceparent); without tracing it costs a no-op
// span.
func TraceHTTP(h http.Handler, operation string) http.Handler {
	return otelhttp.NewHandler(h, operation, otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string {
		switch {
		case r.Pattern == "": // not routed yet: the method alone, never the raw path
			return r.Method
		case strings.Contains(r.Pattern, " "): // "POST /v1/payments"
			return r.Pattern
		}
		return r.Method + " " + r.Pattern
	}))
}
