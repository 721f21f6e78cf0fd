package onceonly

// What a service runs beside its handlers, started by one call: the relay
// (outbox → Redis), the reconciler on its schedule and the resumer, all from
// the engine's own settings, so none can disagree with it.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceonly/onceonly/reconcile"
	"github.com/onceonly/onceonly/relay"
	"github.com/onceonly/onceonly/startstop"
)

// Daemons configures what Engine.Start runs (Config.Daemons). The zero
// value runs all three: the relay, listening on a connection made from
// Pool's settings; the reconciler on reconcile.DefaultSchedule; the
// resumer every ResumeInterval.
type Daemons struct {
	// NoRelay, NoReconciler and NoResumer leave one out, for a service that
	// runs it elsewhere (the relay and reconciler commands, cmd/relay and
	// cmd/reconciler). Several relays and resumers may run at once, in any
	// number of processes; reconciler passes take a Postgres advisory lock,
	// so one runs at a time however many are scheduled.
	NoRelay, NoReconciler, NoResumer bool
	// Listen is a session-capable connection (straight to Postgres, or a
	// session pool) on which the relay LISTENs, to deliver as soon as a
	// key's event is written. Nil uses Pool's connection settings.
	Listen *pgx.ConnConfig
	// NoListen makes the relay poll only (every PollInterval): set it when
	// Pool goes through PgBouncer in transaction mode and Listen is nil.
	NoListen bool
	// PollInterval is how often the relay looks for events it was not told
	// about (relay.DefaultPollInterval when zero).
	PollInterval time.Duration
	// ReconcileSchedule is the reconciler's cron spec
	// (reconcile.DefaultSchedule, "@every 1m", when empty).
	ReconcileSchedule string
	// ReapGrace is how long past its lease the reconciler leaves an
	// execution before it fails it (reconcile's default when zero).
	ReapGrace time.Duration
}

// ErrClosed is returned by Start on an engine that was closed: Close stops
// the daemons for good, and nothing would stop daemons started after it.
var ErrClosed = errors.New("onceonly: engine closed")

// Start runs, in this process, what every service that uses the engine must
// run beside its handlers (Config.Daemons leaves any of them out):
//
//   - the relay, which copies each key's committed state from the outbox
//     into Redis and deletes the outbox row;
//   - the reconciler, on its schedule: it repairs Redis keys that drifted
//     from Postgres, fails the keys of dead executions, deletes expired
//     keys;
//   - the resumer, which finishes the executions of registered handlers
//     whose holder died after a step started (Resume).
//
// Their settings are the engine's (Pool, Redis, RedisPrefix,
// MaxCachedBody, FailedTTL, Registerer, Logger), so none can disagree with
// it. Start returns once all three run; they stop when ctx ends, or at Stop
// or Close. Starting an engine that runs them already does nothing; once
// the context of the last Start has ended, Start starts them anew. After
// Close, Start returns ErrClosed.
func (e *Engine) Start(ctx context.Context) error {
	if err := e.made(); err != nil {
		return err
	}
	e.daemonsMu.Lock()
	defer e.daemonsMu.Unlock()
	if e.daemonsClosed {
		return ErrClosed
	}
	if e.daemonsRunning() {
		return nil
	}
	if e.daemons == nil { // built once, so their metrics register once
		services, err := e.newDaemons()
		if err != nil {
			return err
		}
		e.daemons = services
	}
	// Those of a Start whose context ended may still be stopping: wait for
	// them, then start them all anew.
	startstop.StopAll(e.daemons...)
	for i, s := range e.daemons {
		if err := s.Start(ctx); err != nil {
			startstop.StopAll(e.daemons[:i]...)
			return fmt.Errorf("start daemons: %w", err)
		}
	}
	e.daemonsDone = ctx.Done()
	e.log.Info("daemons started", "relay", !e.cfg.Daemons.NoRelay,
		"reconciler", !e.cfg.Daemons.NoReconciler, "resumer", !e.cfg.Daemons.NoResumer)
	return nil
}

// Stop stops what Start started and waits for it: a relay batch or a
// reconcile pass under way gets its own timeout to finish (relay.Config
// BatchTimeout, reconcile.Config PassTimeout), a resumption under way is
// canceled and its key resumed again later. It returns ctx's error if ctx
// ends first; the daemons still stop.
func (e *Engine) Stop(ctx context.Context) error {
	if e == nil || e.store == nil {
		return nil // not made by New: nothing was started
	}
	e.daemonsMu.Lock()
	services := e.daemons
	e.daemonsMu.Unlock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		startstop.StopAll(services...)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stop daemons: %w", ctx.Err())
	}
}

// daemonsRunning reports whether Start has run the daemons, its context is
// still live and every daemon still runs: none was stopped, by Stop or by
// itself (under daemonsMu).
func (e *Engine) daemonsRunning() bool {
	if e.daemons == nil || isClosed(e.daemonsDone) {
		return false
	}
	for _, s := range e.daemons {
		if isClosed(s.Stopped()) {
			return false
		}
	}
	return true
}

// isClosed reports whether c is closed; a nil c (a context that never ends)
// never is.
func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// closeDaemons stops what Start started, for good: Start returns ErrClosed
// from then on.
func (e *Engine) closeDaemons() {
	e.daemonsMu.Lock()
	e.daemonsClosed = true
	e.daemonsMu.Unlock()
	_ = e.Stop(context.Background()) // returns once they stopped
}

// newDaemons builds the services Config.Daemons asks for.
func (e *Engine) newDaemons() ([]startstop.Service, error) {
	d := e.cfg.Daemons
	if e.cfg.Redis == nil && (!d.NoRelay || !d.NoReconciler) {
		return nil, ErrNoRedisForDaemons
	}
	var services []startstop.Service
	if !d.NoRelay {
		listen := d.Listen
		if listen == nil && !d.NoListen {
			listen = e.cfg.Pool.Config().ConnConfig.Copy()
		}
		r, err := relay.New(relay.Config{
			Pool: e.cfg.Pool, Redis: e.cfg.Redis, RedisPrefix: e.cfg.RedisPrefix,
			RedisWriteLayout1: e.cfg.Tuning.RedisWriteLayout1, MaxCachedBody: e.cfg.MaxCachedBody,
			PollInterval: d.PollInterval, Listen: listen,
			Logger: e.log.With("daemon", "relay"), Registerer: e.cfg.Registerer,
		})
		if err != nil {
			return nil, fmt.Errorf("relay: %w", err)
		}
		services = append(services, r)
	}
	if !d.NoReconciler {
		r, err := reconcile.New(reconcile.Config{
			Pool: e.cfg.Pool, Redis: e.cfg.Redis, RedisPrefix: e.cfg.RedisPrefix,
			RedisWriteLayout1: e.cfg.Tuning.RedisWriteLayout1, MaxCachedBody: e.cfg.MaxCachedBody,
			Schedule: d.ReconcileSchedule, ReapGrace: d.ReapGrace, FailedTTL: e.cfg.FailedTTL,
			Logger: e.log.With("daemon", "reconciler"), Registerer: e.cfg.Registerer,
		})
		if err != nil {
			return nil, fmt.Errorf("reconciler: %w", err)
		}
		services = append(services, r)
	}
	if !d.NoResumer {
		services = append(services, &resumer{e: e})
	}
	return services, nil
}
