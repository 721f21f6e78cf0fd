package startstop_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/onceonly/onceonly/startstop"
)

// TestMain fails the package's tests when a goroutine outlives them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// loop is a service whose loop counts its runs, waits for its context, then
// records the cause and whether it was still running when Stop returned.
type loop struct {
	base     startstop.Base
	runs     atomic.Int32
	running  atomic.Bool
	active   atomic.Int32 // loops running now
	most     atomic.Int32 // the most ever running at once
	cause    atomic.Value
	startErr error
	// hold, when set, is waited on after the context ends, before the loop
	// returns (a loop finishing its work); ending is closed just before.
	hold, ending chan struct{}
}

func (l *loop) Start(ctx context.Context) error {
	ctx, ok, started, stopped := l.base.StartInit(ctx)
	if !ok {
		return nil
	}
	if l.startErr != nil {
		stopped()
		return l.startErr
	}
	l.running.Store(true)
	go func() {
		defer stopped()
		defer l.running.Store(false)
		l.runs.Add(1)
		n := l.active.Add(1)
		defer l.active.Add(-1)
		for m := l.most.Load(); n > m; m = l.most.Load() {
			if l.most.CompareAndSwap(m, n) {
				break
			}
		}
		started()
		<-ctx.Done()
		l.cause.Store(context.Cause(ctx))
		if l.hold != nil {
			close(l.ending)
			<-l.hold
		}
	}()
	return nil
}

// lastCause is the cause of the last loop's context, once it has ended.
func (l *loop) lastCause() error {
	err, _ := l.cause.Load().(error)
	return err
}

func (l *loop) Started() <-chan struct{} { return l.base.Started() }
func (l *loop) Stopped() <-chan struct{} { return l.base.Stopped() }
func (l *loop) Stop()                    { l.base.Stop() }

var _ startstop.Service = (*loop)(nil)

func TestStartStop(t *testing.T) {
	l := &loop{}
	require.NoError(t, l.Start(t.Context()))
	<-l.Started()
	stopped := l.Stopped()
	l.Stop()
	require.False(t, l.running.Load(), "Stop returned before the loop")
	require.ErrorIs(t, l.lastCause(), startstop.ErrStop)
	<-stopped
	require.EqualValues(t, 1, l.runs.Load())
}

// TestStartTwice fails if StartInit let a second Start through while the
// loop runs: a second loop would start (or the first be restarted).
func TestStartTwice(t *testing.T) {
	l := &loop{}
	require.NoError(t, l.Start(t.Context()))
	<-l.Started()
	require.NoError(t, l.Start(t.Context()))
	<-l.Started()
	require.EqualValues(t, 1, l.runs.Load(), "one loop for two Starts")
	require.EqualValues(t, 1, l.active.Load())
	l.Stop()
	require.EqualValues(t, 1, l.runs.Load())
}

// TestStopTwiceAndWithoutStart fails (a nil cancel called, or a wait on a
// nil channel) if Stop did not tell a stopped service from a running one.
func TestStopTwiceAndWithoutStart(t *testing.T) {
	l := &loop{}
	l.Stop()
	<-l.Stopped() // never started: stopped
	require.NoError(t, l.Start(t.Context()))
	l.Stop()
	l.Stop()
	require.EqualValues(t, 1, l.runs.Load())
}

// TestStopWaits: every concurrent Stop returns only after the loop has.
func TestStopWaits(t *testing.T) {
	l := &loop{hold: make(chan struct{}), ending: make(chan struct{})}
	require.NoError(t, l.Start(t.Context()))
	<-l.Started()
	var wg sync.WaitGroup
	var returned, early atomic.Int32
	for range 3 {
		wg.Go(func() {
			l.Stop()
			if l.running.Load() {
				early.Add(1)
			}
			returned.Add(1)
		})
	}
	<-l.ending // a Stop has canceled the loop, which is finishing
	require.Zero(t, returned.Load(), "Stop returned before the loop")
	close(l.hold)
	wg.Wait()
	require.EqualValues(t, 3, returned.Load())
	require.Zero(t, early.Load(), "Stop returned before the loop")
}

func TestRestart(t *testing.T) {
	l := &loop{}
	for range 3 {
		require.NoError(t, l.Start(t.Context()))
		<-l.Started()
		l.Stop()
	}
	require.EqualValues(t, 3, l.runs.Load())
}

// TestEndsWithItsContext: the loop ends when the context Start was given
// ends (the cause is that context's), and the service can then start again
// without a Stop in between.
func TestEndsWithItsContext(t *testing.T) {
	l := &loop{}
	ctx, cancel := context.WithCancel(t.Context())
	require.NoError(t, l.Start(ctx))
	cancel()
	<-l.Stopped()
	require.ErrorIs(t, l.lastCause(), context.Canceled)
	require.NotErrorIs(t, l.lastCause(), startstop.ErrStop)

	require.NoError(t, l.Start(t.Context()))
	<-l.Started()
	require.True(t, l.running.Load())
	l.Stop()
	require.EqualValues(t, 2, l.runs.Load())
}

// TestStartedBeforeStart: a wait begun before Start ends with the start.
func TestStartedBeforeStart(t *testing.T) {
	l := &loop{}
	started := l.Started()
	require.NoError(t, l.Start(t.Context()))
	<-started
	l.Stop()
}

// TestFailedStart: Start's error comes back, waits on Started end, and the
// service can be started again.
func TestFailedStart(t *testing.T) {
	boom := errors.New("boom")
	l := &loop{startErr: boom}
	started := l.Started()
	require.ErrorIs(t, l.Start(t.Context()), boom)
	<-started
	<-l.Stopped()
	l.Stop()
	l.startErr = nil
	require.NoError(t, l.Start(t.Context()))
	l.Stop()
	require.EqualValues(t, 1, l.runs.Load())
}

func TestRun(t *testing.T) {
	t.Run("context", func(t *testing.T) {
		l := &loop{}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- startstop.Run(ctx, l) }()
		<-l.Started()
		cancel()
		require.NoError(t, <-done)
		require.False(t, l.running.Load())
	})
	t.Run("stop", func(t *testing.T) {
		l := &loop{}
		done := make(chan error, 1)
		go func() { done <- startstop.Run(t.Context(), l) }()
		<-l.Started()
		l.Stop()
		require.NoError(t, <-done)
		require.ErrorIs(t, l.lastCause(), startstop.ErrStop)
	})
	t.Run("start error", func(t *testing.T) {
		boom := errors.New("boom")
		require.ErrorIs(t, startstop.Run(t.Context(), &loop{startErr: boom}), boom)
	})
}

func TestStopAll(t *testing.T) {
	ls := []*loop{{}, {}, {}}
	services := make([]startstop.Service, 0, len(ls)+1)
	for _, l := range ls {
		require.NoError(t, l.Start(t.Context()))
		services = append(services, l)
	}
	startstop.StopAll(append(services, &loop{})...) // the last never started
	for _, l := range ls {
		require.False(t, l.running.Load())
		require.EqualValues(t, 1, l.runs.Load())
	}
}

// TestConcurrent hammers one service from several goroutines (for -race):
// whatever the interleaving, at most one loop runs at a time and none
// outlives the last Stop.
func TestConcurrent(t *testing.T) {
	l := &loop{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 50 {
				_ = l.Start(t.Context())
				_ = l.Started()
				_ = l.Stopped()
				l.Stop()
			}
		})
	}
	wg.Wait()
	l.Stop()
	require.False(t, l.running.Load())
	require.NotZero(t, l.runs.Load())
	require.EqualValues(t, 1, l.most.Load(), "two loops ran at once")
}

// Fail ends the running loop with its error as the cause of the loop's
// context; without a running loop it does nothing.
func TestFail(t *testing.T) {
	l := &loop{}
	boom := errors.New("boom")
	l.base.Fail(boom) // not started: nothing to end
	require.NoError(t, l.Start(t.Context()))
	<-l.Started()
	stopped := l.Stopped()
	l.base.Fail(boom)
	<-stopped
	require.ErrorIs(t, l.lastCause(), boom)
	l.Stop()
}
