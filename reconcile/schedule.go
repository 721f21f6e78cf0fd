package reconcile

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/robfig/cron/v3"
)

// shutdownWait is how long Run waits at a stop for a running pass before
// canceling it; a daemon still exits within 10 s of SIGTERM.
const shutdownWait = 7 * time.Second

// Run starts passes on the configured schedule until ctx ends. Ticks that
// come while a pass runs are skipped, not queued. On stop it waits for the
// running pass, and cancels it if it outlasts shutdownWait. It returns nil
// after a graceful stop.
func (r *Reconciler) Run(ctx context.Context) error {
	// Passes are not canceled by the stop signal itself, only after the wait.
	passCtx, cancelPasses := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelPasses()
	logger := cronLogger{r.log}
	c := cron.New(cron.WithChain(cron.Recover(logger), cron.SkipIfStillRunning(logger)), cron.WithLogger(logger))
	if _, err := c.AddFunc(r.cfg.Schedule, func() {
		_, _ = r.Pass(passCtx, false) // the pass logs its own line
	}); err != nil {
		return fmt.Errorf("schedule %q: %w", r.cfg.Schedule, err)
	}
	c.Start()
	<-ctx.Done()
	stopped := c.Stop()
	select {
	case <-stopped.Done():
	case <-time.After(shutdownWait):
		r.log.Warn("reconcile pass still running at shutdown: canceling it")
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
