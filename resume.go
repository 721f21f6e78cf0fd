package onceonly

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/onceonly/onceonly/internal/pgretry"
	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/outbox"
	"github.com/onceonly/onceonly/startstop"
)

// Register names fn so this engine can resume its executions: one whose
// process died (or whose holder handed it off) after a step started is
// taken over by a live engine's Resume and finished, without any client
// retry (I12). Every process that serves the handler registers it under
// the same name.
func (e *Engine) Register(name string, fn Func) error {
	if err := e.made(); err != nil {
		return err
	}
	if name == "" || fn == nil {
		return errors.New("onceonly: register: a name and a Func are required")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, dup := e.funcs[name]; dup {
		return fmt.Errorf("onceonly: register: %q is registered already", name)
	}
	e.funcs[name] = fn
	return nil
}

// Run runs the registered handler name once for (scope, key), with request
// as its payload (the fingerprint and Execution.Request): the first call
// runs it, later calls get its stored Result with Replayed set. Errors as
// for Do.
func (e *Engine) Run(ctx context.Context, name, scope, key string, request []byte) (Outcome, error) {
	if err := e.made(); err != nil {
		return Outcome{}, err
	}
	fn, ok := e.registered(name)
	if !ok {
		return Outcome{}, fmt.Errorf("onceonly: run: no handler registered as %q", name)
	}
	return e.execute(ctx, e.modeFor(), scope, key, fingerprint{value: payloadFingerprint(request)}, name, func() []byte { return request }, fn)
}

func (e *Engine) registered(name string) (Func, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	fn, ok := e.funcs[name]
	return fn, ok
}

// resumeBatch is the most executions one look takes over.
const resumeBatch = 16

// Resume finishes, every ResumeInterval until ctx ends, the executions of
// registered handlers that started a step and whose lease ran out. Run it
// in every process that registers handlers; any number may run at once.
// It returns nil when ctx ends.
func (e *Engine) Resume(ctx context.Context) error {
	if err := e.made(); err != nil {
		return err
	}
	return startstop.Run(ctx, &resumer{e: e})
}

// resumer is the loop of one Resume, a startstop service.
type resumer struct {
	startstop.Base
	e *Engine
}

// Start starts resuming every ResumeInterval until ctx ends or Stop.
func (r *resumer) Start(ctx context.Context) error {
	ctx, ok, started, stopped := r.StartInit(ctx)
	if !ok {
		return nil
	}
	go func() {
		defer stopped()
		started()
		r.loop(ctx)
	}()
	return nil
}

func (r *resumer) loop(ctx context.Context) {
	t := time.NewTicker(r.e.cfg.ResumeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := r.e.ResumeOnce(ctx); err != nil && ctx.Err() == nil {
			r.e.log.Warn("resume executions", "err", err)
		}
	}
}

// ResumeOnce takes over the executions due for a resumption now (up to a
// batch) and finishes them; it returns how many it took.
func (e *Engine) ResumeOnce(ctx context.Context) (int, error) {
	if err := e.made(); err != nil {
		return 0, err
	}
	e.mu.Lock()
	names := make([]string, 0, len(e.funcs))
	for name := range e.funcs {
		names = append(names, name)
	}
	e.mu.Unlock()
	if len(names) == 0 {
		return 0, nil
	}
	owners := make([]keystate.Owner, resumeBatch)
	for i := range owners {
		owners[i] = e.owners.Next()
	}
	claimedAt := time.Now()
	due, err := pgretry.OnLiveConnection(ctx, e.cfg.Pool, func() ([]outbox.Resumable, error) {
		return e.store.ResumeClaim(ctx, e.cfg.Pool, names, owners, e.cfg.LeaseTimeout)
	})
	if err != nil {
		return 0, fmt.Errorf("resume: %w", err)
	}
	var wg sync.WaitGroup
	for _, r := range due {
		fn, _ := e.registered(r.Handler)
		request := r.Request
		x := e.newExecution(twoPhase{e}, r.Key.Ref, r.Key.Owner, r.Handler, func() []byte { return request })
		x.fence.Version, x.fingerprint, x.claimedAt, x.by = r.Key.Version, r.Key.Fingerprint, claimedAt, byResumer
		if err := x.loadSteps(r.Steps); err != nil {
			e.log.Error("resume from recorded steps: calling them again", "scope", r.Key.Scope, "key", r.Key.Key, "err", err)
		}
		wg.Go(func() {
			e.applyCache(ctx, r.Key) // in its goroutine: a slow Redis delays no other resumption
			e.resume(ctx, x, fn)
		})
	}
	wg.Wait()
	return len(due), nil
}

// resume finishes x, an execution this engine took over at x.claimedAt;
// run logs its end ("execution resumed"). A panic of the handler is
// logged, not raised: it would end the process, and call has handed the
// key off already.
func (e *Engine) resume(ctx context.Context, x *Execution, fn Func) {
	ctx, span := e.startSpan(ctx, spanExecute)
	if span.IsRecording() {
		span.SetAttributes(attrScope.String(x.ref.Scope), attrHandler.String(x.handler), attrResumed.Bool(true))
	}
	outcome := outcomePanic
	var err error
	defer func() {
		tracedOutcome(span, outcome, false, err)
		e.metrics.resumptions.WithLabelValues(outcome).Inc()
		if p := recover(); p != nil {
			e.log.Error("resumed handler panicked", "scope", x.ref.Scope, "key", x.ref.Key, "handler", x.handler,
				"panic", p, "stack", string(debug.Stack()))
		}
	}()
	_, outcome, err = e.run(ctx, x, fn)
}
