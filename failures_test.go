package onceonly_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/oncetest"
	"github.com/onceonly/onceonly/outbox"
)

// codeError is a handler's own error type, which errors.As must still
// find through the engine's *ExecutionError.
type codeError struct{ code string }

func (e *codeError) Error() string { return "declined: " + e.code }

// failing is a handler that fails with err, after a write the engine must
// roll back.
func failing(err error) onceonly.Handler {
	return func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
		if _, werr := payment(201, "{}")(ctx, tx); werr != nil {
			return onceonly.Result{}, werr
		}
		return onceonly.Result{}, err
	}
}

// failures reads the failures column of the tests' key, "k".
func (b *testBundle) failures(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT failures FROM idempotency_keys WHERE key = 'k'`).Scan(&n))
	return n
}

// requireExecutionError returns err as an *ExecutionError.
func requireExecutionError(t *testing.T, err error) *onceonly.ExecutionError {
	t.Helper()
	failed, ok := errors.AsType[*onceonly.ExecutionError](err)
	require.True(t, ok, "an *ExecutionError, got %T: %v", err, err)
	return failed
}

// TestFailuresCountFailedExecutions: every execution whose handler fails
// adds one to the key's failures, which the *ExecutionError returned
// carries; the handler's own error stays reachable through it; a success
// after three failures completes the key.
func TestFailuresCountFailedExecutions(t *testing.T) {
	t.Parallel()
	for _, single := range []bool{false, true} {
		t.Run(map[bool]string{false: "TwoPhase", true: "SingleCommit"}[single], func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{})
			e := b.engine
			if single {
				e = b.singleEngine(t, 0) // its first failure writes the key's row; the next go the two-phase way
			}
			declined := &codeError{code: "insufficient_funds"}
			for want := 1; want <= 3; want++ {
				_, err := e.Do(b.ctx, "m", "k", []byte("p"), failing(declined))
				failed := requireExecutionError(t, err)
				require.False(t, failed.HandedOff)
				require.Equal(t, want, failed.Failures, "failure %d", want)
				require.ErrorIs(t, err, declined, "errors.Is sees the handler's error")
				got, ok := errors.AsType[*codeError](err)
				require.True(t, ok, "errors.As sees the handler's error type")
				require.Equal(t, "insufficient_funds", got.code)
				require.Equal(t, declined.Error(), err.Error(), "the message is the handler's")
				require.Equal(t, want, b.failures(t))
			}
			out, err := e.Do(b.ctx, "m", "k", []byte("p"), payment(201, `{"ok":true}`))
			require.NoError(t, err)
			require.False(t, out.Replayed)
			require.Equal(t, "completed", b.keyStatus(t, "k"))
			require.Equal(t, 3, b.failures(t), "a completed key keeps the count of its failures")
			require.Equal(t, 1, b.payments(t), "the failed executions' writes rolled back")
		})
	}
}

// TestNotStoredResultCountsButIsNoError: a Result whose status is not
// stored fails the key and counts, but is an answer: no error.
func TestNotStoredResultCountsButIsNoError(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	out, err := b.engine.Do(b.ctx, "m", "k", []byte("p"), payment(http.StatusServiceUnavailable, `{"error":"later"}`))
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, out.Status)
	require.Equal(t, "failed", b.keyStatus(t, "k"))
	require.Equal(t, 1, b.failures(t))
	_, err = b.engine.Do(b.ctx, "m", "k", []byte("p"), failing(errors.New("boom")))
	require.Equal(t, 2, requireExecutionError(t, err).Failures)
	in, err := b.engine.Inspect(b.ctx, "m", "k")
	require.NoError(t, err)
	require.Equal(t, 2, in.Postgres.Failures, "Inspect shows the count")
}

// TestCanceledCallerIsNoFailure: a handler that fails because its caller
// left returns the context's error, and is not counted against the key.
func TestCanceledCallerIsNoFailure(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx, cancel := context.WithCancel(b.ctx)
	_, err := b.engine.Do(ctx, "m", "k", []byte("p"), func(ctx context.Context, _ pgx.Tx) (onceonly.Result, error) {
		cancel()
		return onceonly.Result{}, ctx.Err()
	})
	require.ErrorIs(t, err, context.Canceled)
	_, isExecution := errors.AsType[*onceonly.ExecutionError](err)
	require.False(t, isExecution)
	require.Equal(t, "failed", b.keyStatus(t, "k"))
	require.Zero(t, b.failures(t))
}

// TestReapedLeaseIsNoFailure: a holder that died and whose lease the
// reconciler reaped leaves the key failed, but its count as it was: only
// handlers that failed count.
func TestReapedLeaseIsNoFailure(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	_, err := b.engine.Do(b.ctx, "m", "k", []byte("p"), failing(errors.New("boom")))
	require.Equal(t, 1, requireExecutionError(t, err).Failures)

	// A process claims the key and dies; its lease runs out and is reaped.
	store := outbox.New(outbox.Config{})
	ref := keystate.Ref{Scope: "m", Key: "k"}
	claim, err := store.Claim(b.ctx, b.pool, ref, onceonly.PayloadFingerprint([]byte("p")), keystate.NewOwner(), 50*time.Millisecond)
	require.NoError(t, err)
	require.True(t, claim.Claimed)
	oncetest.AwaitLeaseOver(t, b.ctx, b.pool, ref, 0)
	reaped, err := store.ReapLeases(b.ctx, b.pool, 0, 10)
	require.NoError(t, err)
	require.Equal(t, 1, reaped)
	require.Equal(t, "failed", b.keyStatus(t, "k"))
	require.Equal(t, 1, b.failures(t), "a reaped lease is no failure")

	_, err = b.engine.Do(b.ctx, "m", "k", []byte("p"), failing(errors.New("boom")))
	require.Equal(t, 2, requireExecutionError(t, err).Failures)
}

// TestStepOutcomeUnknownIsHandedOff: a handler whose step's call failed
// (its outcome unknown) and that returns that error is handed off, not
// failed: its *ExecutionError says so, wraps the step's error, and counts
// no failure.
func TestStepOutcomeUnknownIsHandedOff(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{lease: 2 * time.Second})
	reset := errors.New("connection reset after the call reached the remote")
	require.NoError(t, b.engine.Register("charge", func(ctx context.Context, _ *onceonly.Execution) (onceonly.Result, error) {
		_, err := onceonly.Step(ctx, "charge", func(context.Context, string) (string, error) { return "", reset })
		if err != nil {
			return onceonly.Result{}, err
		}
		return onceonly.Result{Status: http.StatusCreated}, nil
	}))
	_, err := b.engine.Run(b.ctx, "charge", "m", "k", []byte(`{}`))
	failed := requireExecutionError(t, err)
	require.True(t, failed.HandedOff)
	require.Zero(t, failed.Failures)
	require.ErrorIs(t, err, reset)
	require.Equal(t, "in_progress", b.keyStatus(t, "k"), "handed off for a resumption")
	require.Zero(t, b.failures(t), "a hand-off is no failure")
}

// TestDoTxFailureIsNotCounted: DoTx undoes its claim with the handler's
// writes, so it records no failure, and its *ExecutionError's count is 0
// (not known).
func TestDoTxFailureIsNotCounted(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	boom := errors.New("boom")
	var err error
	require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		_, err = b.engine.DoTx(b.ctx, tx, "m", "k", []byte("p"), failing(boom))
		return nil
	}))
	failed := requireExecutionError(t, err)
	require.ErrorIs(t, err, boom)
	require.False(t, failed.HandedOff)
	require.Zero(t, failed.Failures)
	require.Equal(t, "absent", b.keyStatus(t, "k"))
}

// TestErrNoEffectFailsAStepped: a handler whose settled step had no effect
// and that says so (ErrNoEffect) fails the key, counted, so its retry runs
// again (the step called again); the same error without ErrNoEffect hands
// the key off, as a step may have had an effect; and ErrNoEffect after a
// step whose outcome is unknown hands it off too.
func TestErrNoEffectFailsAStepped(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{lease: 2 * time.Second})
	var calls int
	declined := errors.New("the gateway charged nothing")
	require.NoError(t, b.engine.Register("pay", func(ctx context.Context, x *onceonly.Execution) (onceonly.Result, error) {
		charged, err := onceonly.Step(ctx, "charge", func(context.Context, string) (bool, error) {
			calls++
			if x.Key() == "unknown" {
				return false, errors.New("reset")
			}
			return false, nil
		})
		switch {
		case err != nil:
			return onceonly.Result{}, fmt.Errorf("%w: %w", onceonly.ErrNoEffect, err)
		case !charged && x.Key() == "silent":
			return onceonly.Result{}, declined
		case !charged:
			return onceonly.Result{}, fmt.Errorf("%w: %w", declined, onceonly.ErrNoEffect)
		}
		return onceonly.Result{Status: http.StatusCreated}, nil
	}))
	for want := 1; want <= 2; want++ {
		_, err := b.engine.Run(b.ctx, "pay", "m", "nothing", []byte(`{}`))
		failed := requireExecutionError(t, err)
		require.False(t, failed.HandedOff)
		require.Equal(t, want, failed.Failures)
		require.ErrorIs(t, err, declined)
		require.Equal(t, "failed", b.keyStatus(t, "nothing"))
		require.Equal(t, want, calls, "a retry of a failed key calls the step again")
	}

	_, err := b.engine.Run(b.ctx, "pay", "m", "silent", []byte(`{}`))
	require.True(t, requireExecutionError(t, err).HandedOff, "without ErrNoEffect, a stepped execution is handed off")
	require.Equal(t, "in_progress", b.keyStatus(t, "silent"))

	_, err = b.engine.Run(b.ctx, "pay", "m", "unknown", []byte(`{}`))
	require.True(t, requireExecutionError(t, err).HandedOff, "an unsettled step is handed off, ErrNoEffect or not")
	var failures int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT failures FROM idempotency_keys WHERE key = 'unknown'`).Scan(&failures))
	require.Zero(t, failures)
}
