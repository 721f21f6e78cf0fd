// Package shutdown runs a command until SIGINT or SIGTERM and stops it
// gracefully: its HTTP server finishes the requests under way, its work
// finishes what it holds, and the process exits within 10 s of the signal.
package shutdown

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// OpsGrace is how long the ops server of a worker daemon gives its requests
// at a stop (see RunBeside).
const OpsGrace = 5 * time.Second

// SignalContext returns a context canceled on SIGINT or SIGTERM; stop
// releases the signals (a second one then kills the process as usual).
func SignalContext() (ctx context.Context, stop context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// Serve runs srv until ctx ends, then shuts it down gracefully, giving
// in-flight requests up to grace to finish. It returns an error when srv
// cannot listen or serve, or when the grace runs out.
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

// RunBeside runs work and the server srv side by side until ctx ends. When
// ctx ends, work is expected to return (finishing what it holds) and the
// server shuts down gracefully (within OpsGrace). If the server cannot
// listen, work is stopped and the server's error returned; otherwise work's
// error is.
func RunBeside(ctx context.Context, srv *http.Server, log *slog.Logger, work func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	serveErr := make(chan error, 1)
	go func() {
		serveErr <- Serve(ctx, srv, log, OpsGrace)
		cancel()
	}()
	workErr := work(ctx)
	cancel()
	if err := <-serveErr; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return workErr
}
