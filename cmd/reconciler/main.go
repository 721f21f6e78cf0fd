// Command reconciler repairs drift between Postgres and the Redis cache,
// reaps dead leases and deletes expired keys, on a cron schedule.
//
//	reconciler                     run passes on RECONCILE_SCHEDULE until SIGTERM
//	reconciler --once [--dry-run]  run one pass, print its JSON report, exit
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/cmd/internal/config"
	"github.com/onceonly/onceonly/cmd/internal/daemon"
	"github.com/onceonly/onceonly/cmd/internal/daemon/shutdown"
	"github.com/onceonly/onceonly/cmd/internal/tracing"
	"github.com/onceonly/onceonly/reconcile"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// settings is the reconciler's configuration.
type settings struct {
	*daemon.Common
	schedule                          *string
	reapGrace, failedTTL, passTimeout *time.Duration
	page                              *int
	once, dryRun                      *bool
}

func define(s *config.Set) *settings {
	return &settings{
		Common:      daemon.DefineCommon(s, ":8082", "Redis URL, redis:// or rediss:// (this, REDIS_CLUSTER_URL or REDIS_SENTINEL_URL is required)"),
		schedule:    s.String("schedule", "RECONCILE_SCHEDULE", reconcile.DefaultSchedule, "when passes run: a cron spec (5 fields) or @every <duration>"),
		reapGrace:   s.Duration("reap-grace", "REAP_GRACE", reconcile.DefaultReapGrace, "grace after a lease expires before the key is marked failed"),
		failedTTL:   s.Duration("failed-ttl", "FAILED_TTL", onceonly.DefaultFailedTTL, "how long a reaped (failed) key is kept"),
		passTimeout: s.Duration("pass-timeout", "RECONCILE_TIMEOUT", reconcile.DefaultPassTimeout, "the longest one pass may run"),
		page:        s.Int("page-size", "RECONCILE_PAGE_SIZE", reconcile.DefaultPageSize, "keys per page of the Postgres and Redis scans"),
		once:        s.FlagSet().Bool("once", false, "run one pass, print its JSON report on stdout and exit"),
		dryRun:      s.FlagSet().Bool("dry-run", false, "with --once: count drift but change nothing"),
	}
}

func run(args []string, stdout, stderr io.Writer) int {
	set := config.NewSet("reconciler", stderr)
	set.SetSynopsis("usage: reconciler [--once [--dry-run]] [flags]")
	s := define(set)
	if code, ok := daemon.ParseArgs(set, "reconciler", args, stderr); !ok {
		return code
	}
	setup, err := s.Validate(stderr, set, true)
	if err == nil {
		err = s.validate()
	}
	if err != nil {
		fmt.Fprintln(stderr, "reconciler:", err)
		return 2
	}
	ctx, stop := shutdown.SignalContext()
	defer stop()
	stopTracing, err := tracing.Start(ctx, "onceonly-reconciler")
	if err != nil {
		fmt.Fprintln(stderr, "reconciler:", err)
		return 2
	}
	defer stopTracing()
	if err := start(ctx, s, setup, stdout); err != nil {
		fmt.Fprintln(stderr, "reconciler:", err)
		return 1
	}
	return 0
}

func (s *settings) validate() error {
	if _, err := cron.ParseStandard(*s.schedule); err != nil {
		return fmt.Errorf("bad configuration: RECONCILE_SCHEDULE=%q: %w", *s.schedule, err)
	}
	if *s.dryRun && !*s.once {
		return errors.New("bad configuration: --dry-run needs --once")
	}
	for name, d := range map[string]time.Duration{"FAILED_TTL": *s.failedTTL, "RECONCILE_TIMEOUT": *s.passTimeout} {
		if d <= 0 {
			return fmt.Errorf("bad configuration: %s must be positive", name)
		}
	}
	return nil
}

func start(ctx context.Context, s *settings, setup daemon.Setup, stdout io.Writer) error {
	log := setup.Log
	w, err := daemon.OpenWorker(ctx, setup)
	if err != nil {
		return err
	}
	defer w.Close()
	r, err := reconcile.New(reconcile.Config{
		Pool: w.Pool, Redis: w.Redis, RedisPrefix: *s.RedisPrefix, RedisWriteLayout1: *s.RedisWriteLayout1,
		Schedule:  *s.schedule,
		ReapGrace: *s.reapGrace, FailedTTL: *s.failedTTL, PageSize: *s.page, PassTimeout: *s.passTimeout,
		Logger: log, Registerer: w.Registry,
	})
	if err != nil {
		return err
	}
	if *s.once {
		rep, err := r.Pass(ctx, *s.dryRun)
		if err != nil {
			return err
		}
		if err := json.NewEncoder(stdout).Encode(rep); err != nil {
			return fmt.Errorf("write the report: %w", err)
		}
		return nil
	}

	log.Info("reconciler started", "addr", *s.HTTPAddr, "schedule", *s.schedule)
	return w.Run(ctx, *s.HTTPAddr, r.Run)
}
