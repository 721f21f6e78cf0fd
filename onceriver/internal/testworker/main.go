// Command testworker is a River worker process for the onceriver kill test:
// it works chargejob jobs through an onceriver.Worker, runs the engine's
// Resume, and answers /readyz on HTTP_ADDR once River has started. The test
// kills it with SIGKILL and starts it again.
//
// Environment: DATABASE_URL (required), GATEWAY_URL (required), HTTP_ADDR
// (required), REDIS_URL and REDIS_PREFIX (optional: without them the engine
// runs from Postgres alone), LEASE_TIMEOUT (4s), RESUME_INTERVAL (200ms),
// JOB_TIMEOUT (3s), RESCUE_AFTER (5s), RETRY_DELAY (200ms, every retry and
// rescue), STEP_PAUSE (200ms, between the charge and the final
// transaction), MAX_WORKERS (4), WORKER_ID (River's client ID; River picks
// one when unset).
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/demo/gateway"
	"github.com/onceonly/onceonly/onceriver"
	"github.com/onceonly/onceonly/onceriver/internal/chargejob"
)

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, log); err != nil {
		log.Error("testworker", "err", err)
		stop()
		os.Exit(1) //nolint:gocritic // stop ran; nothing else is deferred that matters on a failure
	}
}

// fixedRetry retries (and rescues) every job after the same delay, instead
// of River's attempt⁴ seconds, so the test ends quickly.
type fixedRetry time.Duration

// NextRetry implements river.ClientRetryPolicy.
func (d fixedRetry) NextRetry(*rivertype.JobRow) time.Time { return time.Now().Add(time.Duration(d)) }

func run(ctx context.Context, log *slog.Logger) error {
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return fmt.Errorf("open pool: %w", err)
	}
	defer pool.Close()
	var rdb redis.UniversalClient
	if u := os.Getenv("REDIS_URL"); u != "" {
		opts, err := redis.ParseURL(u)
		if err != nil {
			return fmt.Errorf("parse REDIS_URL: %w", err)
		}
		client := redis.NewClient(opts)
		defer client.Close()
		rdb = client
	}
	engine, err := onceonly.New(onceonly.Config{
		Pool: pool, Redis: rdb, RedisPrefix: os.Getenv("REDIS_PREFIX"), Logger: log,
		LeaseTimeout:   duration("LEASE_TIMEOUT", 4*time.Second),
		ResumeInterval: duration("RESUME_INTERVAL", 200*time.Millisecond),
	})
	if err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	defer engine.Close()

	gw := &gateway.Client{BaseURL: os.Getenv("GATEWAY_URL"), HTTP: &http.Client{Timeout: 10 * time.Second}}
	w, err := onceriver.NewWorker(engine, chargejob.Handler(gw, duration("STEP_PAUSE", 200*time.Millisecond)), onceriver.Options[chargejob.Args]{Logger: log})
	if err != nil {
		return err
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, w)
	maxWorkers, err := strconv.Atoi(cmp.Or(os.Getenv("MAX_WORKERS"), "4"))
	if err != nil {
		return fmt.Errorf("MAX_WORKERS: %w", err)
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		ID:                   os.Getenv("WORKER_ID"),
		Queues:               map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: maxWorkers}},
		Workers:              workers,
		JobTimeout:           duration("JOB_TIMEOUT", 3*time.Second),
		RescueStuckJobsAfter: duration("RESCUE_AFTER", 5*time.Second),
		RetryPolicy:          fixedRetry(duration("RETRY_DELAY", 200*time.Millisecond)),
		FetchPollInterval:    100 * time.Millisecond,
		Logger:               log.With("component", "river"),
	})
	if err != nil {
		return fmt.Errorf("river client: %w", err)
	}
	if err := client.Start(ctx); err != nil {
		return fmt.Errorf("start river: %w", err)
	}
	resumed := make(chan struct{})
	go func() {
		defer close(resumed)
		_ = engine.Resume(ctx)
	}()

	srv := &http.Server{
		Addr: os.Getenv("HTTP_ADDR"), ReadHeaderTimeout: 5 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }),
	}
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", srv.Addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("serve", "err", err)
		}
	}()
	log.Info("testworker ready")

	<-ctx.Done()
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(stopCtx)
	err = client.Stop(stopCtx)
	<-resumed
	if err != nil {
		return fmt.Errorf("stop river: %w", err)
	}
	return nil
}

// duration reads a duration from the environment, def when unset.
func duration(name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		panic(fmt.Sprintf("%s=%q: %v", name, v, err))
	}
	return d
}
