package reconcile

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/onceonly/onceonly/startstop"
)

// shutdownWait is how long a stop waits for a running pass before
// canceling it; a daemon still exits within 10 s of SIGTERM.
const shutdownWait = 7 * time.Second

// Run starts passes on the configured schedule until ctx ends (or Stop is
// called). Ticks that come while a pass runs are skipped, not queued. On
// stop it waits for the running pass, and cancels it if it outlasts
// shutdownWait. It returns nil after a graceful stop.
func (r *Reconciler) Run(ctx context.Context) error {
	return startstop.Run(ctx, r)
}

// Start schedules passes in the background, as Run does, and returns at
// once; they end when ctx ends or at Stop. Starting a running reconciler
// does nothing.
func (r *Reconciler) Start(ctx context.Context) error {
	ctx, ok, started, stopped := r.life.StartInit(ctx)
	if !ok {
		return nil
	}
	// Passes are not canceled by the stop itself, only after the wait.
	passCtx, cancelPasses := context.WithCancel(context.WithoutCancel(ctx))
	logger := cronLogger{r.log}
	c := cron.New(cron.WithChain(cron.Recover(logger), cron.SkipIfStillRunning(logger)), cron.WithLogger(logger))
	if _, err := c.AddFunc(r.cfg.Schedule, func() {
		_, _ = r.Pass(passCtx, false) // the pass logs its own line
	}); err != nil {
		cancelPasses()
		stopped()
		return fmt.Errorf("reconcile: schedule %q: %w", r.cfg.Schedule, err)
	}
	c.Start()
	go func() {
		defer stopped()
		defer cancelPasses()
		started()
		<-ctx.Done()
		r.stopCron(c, cancelPasses)
	}()
	return nil
}

// stopCron stops c's schedule and waits for the running pass, canceling it
// after shutdownWait.
func (r *Reconciler) stopCron(c *cron.Cron, cancelPasses context.CancelFunc) {
	done := c.Stop()
	select {
	case <-done.Done():
	case <-time.After(shutdownWait):
		r.log.Warn("reconcile pass still running at shutdown: canceling it")
		cancelPasses()
		<-done.Done()
	}
}

// Stop ends the schedule and returns once the running pass, if any, has
// finished (or been canceled, after shutdownWait). It is safe to call twice,
// or without Start.
func (r *Reconciler) Stop() { r.life.Stop() }

// Started returns a channel closed once the schedule has started.
func (r *Reconciler) Started() <-chan struct{} { return r.life.Started() }

// Stopped returns a channel closed once the schedule started last has
// stopped (closed already when it is not running).
func (r *Reconciler) Stopped() <-chan struct{} { return r.life.Stopped() }

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
