// Command reconciler repairs drift between Postgres and the Redis cache,
// reaps dead leases and deletes expired keys, on a cron schedule.
//
//	reconciler                     run passes on RECONCILE_SCHEDULE until SIGTERM
//	reconciler --once [--dry-run]  run one pass, print its JSON report, exit
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/internal/config"
	"github.com/onceonly/onceonly/internal/daemon"
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
		Common:      daemon.DefineCommon(s, ":8082", "Redis URL, redis:// or rediss:// (this or REDIS_CLUSTER_URL is required)"),
		schedule:    s.String("schedule", "RECONCILE_SCHEDULE", "@every 1m", "when passes run: a cron spec (5 fields) or @every <duration>"),
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
	ctx, stop := daemon.SignalContext()
	defer stop()
	if err := start(ctx, s, setup, stdout); err != nil {
		fmt.Fprintln(stderr, "reconciler:", err)
		return 1
	}
	return 0
}

func (s *settings) validate() error {
	if _, err := cron.ParseStandard(*s.schedule); err != nil {
		return fmt.Errorf("bad configuration: RECONCILE_SCHEDULE=%q: %v", *s.schedule, err)
	}
	if *s.dryRun && !*s.once {
		return fmt.Errorf("bad configuration: --dry-run needs --once")
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
	w, err := daemon.OpenWorker(ctx, setup, *s.RedisPrefix)
	if err != nil {
		return err
	}
	defer w.Close()
	r, err := reconcile.New(reconcile.Config{
		Pool: w.Pool, Cache: w.Cache,
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
		return json.NewEncoder(stdout).Encode(rep)
	}

	log.Info("reconciler started", "addr", *s.HTTPAddr, "schedule", *s.schedule)
	return w.Run(ctx, *s.HTTPAddr, func(ctx context.Context) error {
		return schedule(ctx, *s.schedule, r, log)
	})
}

// shutdownWait is how long a stop waits for a running pass before
// canceling it; the process still exits within 10 s of SIGTERM.
const shutdownWait = 7 * time.Second

// schedule runs passes on spec until ctx ends. Ticks that come while a pass
// runs are skipped, not queued. On stop it waits for the running pass, and
// cancels it if it outlasts shutdownWait.
func schedule(ctx context.Context, spec string, r *reconcile.Reconciler, log *slog.Logger) error {
	// Passes are not canceled by the stop signal itself, only after the wait.
	passCtx, cancelPasses := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelPasses()
	logger := cronLogger{log}
	c := cron.New(cron.WithChain(cron.Recover(logger), cron.SkipIfStillRunning(logger)), cron.WithLogger(logger))
	if _, err := c.AddFunc(spec, func() {
		_, _ = r.Pass(passCtx, false) // the pass logs its own line
	}); err != nil {
		return fmt.Errorf("schedule %q: %w", spec, err)
	}
	c.Start()
	<-ctx.Done()
	stopped := c.Stop()
	select {
	case <-stopped.Done():
	case <-time.After(shutdownWait):
		log.Warn("reconcile pass still running at shutdown: canceling it")
		cancelPasses()
		<-stopped.Done()
	}
	return nil
}

// cronLogger routes cron's logs to slog: a skipped tick at info, the rest of
// its Info lines (every schedule step) at debug.
type cronLogger struct{ log *slog.Logger }

func (l cronLogger) Info(msg string, kv ...any) {
	if msg == "skip" {
		l.log.Info("reconcile tick skipped: the previous pass is still running")
		return
	}
	l.log.Debug("cron: "+msg, kv...)
}
func (l cronLogger) Error(err error, msg string, kv ...any) {
	l.log.Error("cron: "+msg, append(kv, "err", err)...)
}
