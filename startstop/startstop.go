// Package startstop is the one start/stop pattern of onceonly's background
// loops (the lease keeper, the relay waker, the resumer, the relay, the
// reconciler), in the shape of river's rivershared/startstop.
//
// A service embeds (or holds) a Base and writes its own Start:
//
//	func (s *Service) Start(ctx context.Context) error {
//		ctx, ok, started, stopped := s.base.StartInit(ctx)
//		if !ok {
//			return nil // running already
//		}
//		if err := s.prepare(); err != nil {
//			stopped() // a failed start leaves the service startable again
//			return err
//		}
//		go func() {
//			defer stopped()
//			started()
//			s.loop(ctx) // returns when ctx ends
//		}()
//		return nil
//	}
//
// Base supplies Stop (cancel the loop's context, wait for the loop to
// return), Started and Stopped (channels to wait on). Stop is safe without a
// Start and safe twice; Start is a no-op while the loop runs; a service that
// has stopped can be started again.
package startstop

import (
	"context"
	"errors"
	"sync"
)

// ErrStop is the cause (context.Cause) of a loop's context when Stop ended
// it, telling a deliberate stop from the end of the context Start was given.
var ErrStop = errors.New("onceonly: service stopped")

// Service is a background loop that starts and stops; Base implements all
// but Start.
type Service interface {
	// Start starts the loop in the background and returns; an error means
	// it could not start (and is not running).
	Start(ctx context.Context) error
	// Started returns a channel closed once the loop has started (or has
	// failed to start).
	Started() <-chan struct{}
	// Stopped returns a channel closed once the loop has returned.
	Stopped() <-chan struct{}
	// Stop ends the loop and returns once it has returned.
	Stop()
}

// Base holds a service's start/stop state. Its zero value is ready; it must
// not be copied after first use.
type Base struct {
	// life is held through StartInit and through the whole of Stop, so a
	// Start during a Stop waits until the old loop has returned.
	life sync.Mutex
	// mu guards the fields below; Started and Stopped take only mu, so
	// they answer during a Stop.
	mu      sync.Mutex
	cancel  context.CancelCauseFunc
	started chan struct{} // closed by the loop's started (or stopped)
	stopped chan struct{} // closed by the loop's stopped; nil: never started
}

// StartInit begins a Start. It returns the context the loop runs on (ctx,
// canceled with cause ErrStop by Stop), whether to start (false while a loop
// is running: the caller returns nil and starts nothing), and two functions
// for the loop: started, to call once it is up (optional), and stopped, to
// call (deferred) when it returns, or at once if the start fails.
func (b *Base) StartInit(ctx context.Context) (_ context.Context, ok bool, started, stopped func()) {
	b.life.Lock()
	defer b.life.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped != nil {
		if !isClosed(b.stopped) {
			return ctx, false, nil, nil
		}
		// The last loop returned by itself (its context ended) and nobody
		// has called Stop since: start afresh.
		b.cancel(ErrStop)
		b.started = nil
	}
	if b.started == nil { // unless Started made it already
		b.started = make(chan struct{})
	}
	startedc, stoppedc := b.started, make(chan struct{})
	b.stopped = stoppedc
	ctx, b.cancel = context.WithCancelCause(ctx)
	closeStarted := sync.OnceFunc(func() { close(startedc) })
	return ctx, true, closeStarted, sync.OnceFunc(func() {
		closeStarted() // nobody waits forever on a loop that failed to start
		close(stoppedc)
	})
}

// Started returns a channel closed once the loop has started, or has
// stopped without starting. Called before Start, it waits for the next
// start.
func (b *Base) Started() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.started == nil {
		b.started = make(chan struct{})
	}
	return b.started
}

// Fail ends the running loop from inside it (a worker that met an error
// no work can get past): it cancels the loop's context with err as its
// cause, which the loop reads with context.Cause as it ends, and returns
// at once. Without a running loop it does nothing.
func (b *Base) Fail(err error) {
	b.mu.Lock()
	cancel, stopped := b.cancel, b.stopped
	b.mu.Unlock()
	if stopped != nil && !isClosed(stopped) {
		cancel(err)
	}
}

// Stopped returns a channel closed once the loop started last has returned;
// a service never started, or stopped, is stopped already (the channel is
// closed). Call it after Start.
func (b *Base) Stopped() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped == nil {
		return closedChan
	}
	return b.stopped
}

// Stop cancels the loop's context (cause ErrStop) and returns once the loop
// has returned. It does nothing on a service never started or stopped
// already, and concurrent calls all wait for the loop. The loop itself must
// not call it: it would wait for itself.
func (b *Base) Stop() {
	b.life.Lock()
	defer b.life.Unlock()
	b.mu.Lock()
	cancel, stopped := b.cancel, b.stopped
	b.mu.Unlock()
	if stopped == nil {
		return
	}
	cancel(ErrStop)
	<-stopped
	b.mu.Lock()
	b.cancel, b.started, b.stopped = nil, nil, nil
	b.mu.Unlock()
}

// Run starts s and waits until it stops, by itself or because ctx ended or
// Stop was called; it then stops s (waiting for its loop) and returns the
// error of Start, if any. It gives a service a blocking Run(ctx).
func Run(ctx context.Context, s Service) error {
	if err := s.Start(ctx); err != nil {
		return err
	}
	select {
	case <-s.Stopped():
	case <-ctx.Done():
	}
	s.Stop()
	return nil
}

// StopAll stops every service at once and returns when all have stopped.
func StopAll(services ...Service) {
	var wg sync.WaitGroup
	for _, s := range services {
		wg.Go(s.Stop)
	}
	wg.Wait()
}

// closedChan is what Stopped returns for a service not running.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
