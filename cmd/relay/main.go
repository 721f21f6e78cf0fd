// Command relay carries outbox events from Postgres to the Redis cache.
//
//	relay            run until SIGTERM, serving /healthz, /readyz, /metrics
//	relay --once     drain what is pending, print {"published":N,"duration_ms":N}, exit
//
// DATABASE_URL may point at PgBouncer in transaction mode (with
// default_query_exec_mode=exec); the relay then polls every
// RELAY_POLL_INTERVAL. With DATABASE_SESSION_URL (a direct connection or a
// session pool) it also LISTENs there and delivers as soon as events are
// written.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceonly/onceonly/cmd/internal/config"
	"github.com/onceonly/onceonly/cmd/internal/daemon"
	"github.com/onceonly/onceonly/cmd/internal/daemon/shutdown"
	"github.com/onceonly/onceonly/cmd/internal/tracing"
	"github.com/onceonly/onceonly/relay"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// settings is the relay's configuration.
type settings struct {
	*daemon.Common
	batch, maxAttempts *int
	inFlight           *int
	pollInterval       *time.Duration
	once               *bool
	sessionURL         *string
	waitReplicas       *int
	waitTimeout        *time.Duration
}

func define(s *config.Set) *settings {
	return &settings{
		Common:       daemon.DefineCommon(s, ":8081", "Redis URL, redis:// or rediss:// (this, REDIS_CLUSTER_URL or REDIS_SENTINEL_URL is required)"),
		batch:        s.Int("batch", "RELAY_BATCH", relay.DefaultBatchSize, "most events per batch"),
		inFlight:     s.Int("in-flight", "RELAY_IN_FLIGHT", relay.DefaultInFlight, "most batches under way at once: the next is taken from Postgres while one is applied to Redis"),
		maxAttempts:  s.Int("max-attempts", "RELAY_MAX_ATTEMPTS", relay.DefaultMaxAttempts, "attempts before an event that cannot be applied is parked"),
		pollInterval: s.Duration("poll-interval", "RELAY_POLL_INTERVAL", relay.DefaultPollInterval, "how often to look for events without a notification"),
		once:         s.FlagSet().Bool("once", false, "drain what is pending, print a JSON summary on stdout and exit"),
		sessionURL:   s.String("database-session-url", "DATABASE_SESSION_URL", "", "a Postgres URL with sessions (direct, or a session pool) to LISTEN on for new events; unset, the relay only polls (DATABASE_URL may be PgBouncer in transaction mode, where LISTEN hears nothing)"),
		waitReplicas: s.Count("redis-wait-replicas", "RELAY_REDIS_WAIT_REPLICAS", 0, "Redis replicas that must hold a batch before its events are deleted (WAIT), so a failover loses none; fewer up: the events wait (unset: 1 with REDIS_SENTINEL_URL, else 0)"),
		waitTimeout:  s.Duration("redis-wait-timeout", "RELAY_REDIS_WAIT_TIMEOUT", relay.DefaultWaitTimeout, "how long a batch waits for those replicas before it is tried again"),
	}
}

func run(args []string, stdout, stderr io.Writer) int {
	set := config.NewSet("relay", stderr)
	set.SetSynopsis("usage: relay [--once] [flags]")
	s := define(set)
	if code, ok := daemon.ParseArgs(set, "relay", args, stderr); !ok {
		return code
	}
	setup, err := s.Validate(stderr, set, true)
	if err != nil {
		fmt.Fprintln(stderr, "relay:", err)
		return 2
	}
	if !set.IsSet("redis-wait-replicas") && setup.Sentinel {
		*s.waitReplicas = 1
	}
	if *s.waitReplicas > 0 && setup.Redis.IsClusterMode {
		fmt.Fprintln(stderr, "relay: bad configuration: RELAY_REDIS_WAIT_REPLICAS needs REDIS_URL or REDIS_SENTINEL_URL, not a cluster")
		return 2
	}
	if *s.pollInterval <= 0 {
		fmt.Fprintln(stderr, "relay: bad configuration: RELAY_POLL_INTERVAL must be positive")
		return 2
	}
	var listen *pgx.ConnConfig
	if *s.sessionURL != "" {
		if listen, err = pgx.ParseConfig(*s.sessionURL); err != nil {
			fmt.Fprintln(stderr, "relay: bad configuration: DATABASE_SESSION_URL:", err)
			return 2
		}
	}
	ctx, stop := shutdown.SignalContext()
	defer stop()
	stopTracing, err := tracing.Start(ctx, "onceonly-relay")
	if err != nil {
		fmt.Fprintln(stderr, "relay:", err)
		return 2
	}
	defer stopTracing()
	if err := start(ctx, s, setup, listen, stdout); err != nil {
		fmt.Fprintln(stderr, "relay:", err)
		return 1
	}
	return 0
}

func start(ctx context.Context, s *settings, setup daemon.Setup, listen *pgx.ConnConfig, stdout io.Writer) error {
	log := setup.Log
	w, err := daemon.OpenWorker(ctx, setup)
	if err != nil {
		return err
	}
	defer w.Close()
	r, err := relay.New(relay.Config{
		Pool: w.Pool, Redis: w.Redis, RedisPrefix: *s.RedisPrefix, RedisWriteLayout1: *s.RedisWriteLayout1,
		BatchSize: *s.batch, InFlight: *s.inFlight, PollInterval: *s.pollInterval, MaxAttempts: *s.maxAttempts, Listen: listen,
		WaitReplicas: *s.waitReplicas, WaitTimeout: *s.waitTimeout,
		Logger: log, Registerer: w.Registry,
	})
	if err != nil {
		return err
	}
	if *s.once {
		began := time.Now()
		n, err := r.Drain(ctx)
		if err != nil {
			return fmt.Errorf("drain: %w (published %d before the failure)", err, n)
		}
		err = json.NewEncoder(stdout).Encode(map[string]int64{
			"published": int64(n), "duration_ms": time.Since(began).Milliseconds(),
		})
		if err != nil {
			return fmt.Errorf("write the summary: %w", err)
		}
		return nil
	}

	log.Info("relay started", "addr", *s.HTTPAddr, "batch", *s.batch, "in_flight", *s.inFlight, "poll_interval", s.pollInterval.String(),
		"redis_wait_replicas", *s.waitReplicas, "listen", listen != nil)
	return w.Run(ctx, *s.HTTPAddr, r.Run)
}
