package onceonly_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
)

// Settle over the engine's real answers: what a broker consumer does with
// each delivery.

// TestSettleAcksFirstExecutionsAndReplays: a delivery whose key completes,
// and every later copy (a replay), is acked.
func TestSettleAcksFirstExecutionsAndReplays(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	for i := range 2 {
		s := onceonly.Settle(b.engine.Do(b.ctx, "m", "k", []byte("p"), payment(201, `{"ok":true}`)))
		require.Equal(t, onceonly.Ack, s.Disposition)
		require.Equal(t, i > 0, s.Outcome.Replayed)
		require.Equal(t, 201, s.Outcome.Status)
		require.NoError(t, s.Err)
	}
	require.Equal(t, 1, b.payments(t))
}

// TestSettleDeadLettersReusedAndInvalidKeys: a key used with another
// payload, or a key that is not valid, can never run: dead-lettered with
// the reason, the handler never called.
func TestSettleDeadLettersReusedAndInvalidKeys(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	_, err := b.engine.Do(b.ctx, "m", "k", []byte("p1"), payment(201, "{}"))
	require.NoError(t, err)
	ran := func(context.Context, pgx.Tx) (onceonly.Result, error) {
		t.Error("the handler ran")
		return onceonly.Result{}, nil
	}

	s := onceonly.Settle(b.engine.Do(b.ctx, "m", "k", []byte("p2"), ran))
	require.Equal(t, onceonly.DeadLetter, s.Disposition)
	require.Equal(t, onceonly.ReasonReused, s.Reason)
	require.ErrorIs(t, s.Err, onceonly.ErrKeyReused)

	s = onceonly.Settle(b.engine.Do(b.ctx, "m", "a key with spaces", []byte("p"), ran))
	require.Equal(t, onceonly.DeadLetter, s.Disposition)
	require.Equal(t, onceonly.ReasonInvalid, s.Reason)
}

// TestSettleRetriesInFlightWithinASecond: a copy whose key another
// execution holds comes again within MaxInFlightRetry, whatever the
// holder's lease (30 s here), from Redis or from Postgres alike.
func TestSettleRetriesInFlightWithinASecond(t *testing.T) {
	t.Parallel()
	for _, noRedis := range []bool{false, true} {
		t.Run(map[bool]string{false: "Redis", true: "PostgresOnly"}[noRedis], func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{lease: 30 * time.Second, noRedis: noRedis})
			inside, release := make(chan struct{}), make(chan struct{})
			done := make(chan error, 1)
			go func() {
				_, err := b.engine.Do(b.ctx, "m", "k", []byte("p"), func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
					close(inside)
					<-release
					return payment(201, "{}")(ctx, tx)
				})
				done <- err
			}()
			<-inside
			out, err := b.engine.Do(b.ctx, "m", "k", []byte("p"), payment(201, "{}"))
			s := onceonly.Settle(out, err)
			close(release)
			require.NoError(t, <-done)

			require.Equal(t, onceonly.Retry, s.Disposition)
			require.Positive(t, s.After)
			require.LessOrEqual(t, s.After, onceonly.MaxInFlightRetry)
			require.Zero(t, s.Failures, "an in-flight answer is no failure")
			inFlight, ok := onceonly.IsInFlight(s.Err)
			require.True(t, ok)
			require.Greater(t, inFlight.LeaseRemaining, 20*time.Second, "the lease's own remainder is kept")

			// The copy, delivered again, is acked as a replay.
			again := onceonly.Settle(b.engine.Do(b.ctx, "m", "k", []byte("p"), payment(201, "{}")))
			require.Equal(t, onceonly.Ack, again.Disposition)
			require.True(t, again.Outcome.Replayed)
		})
	}
}

// TestSettleDeadLettersAfterMaxFailures: a delivery whose handler keeps
// failing is retried with backoff until MaxFailures executions of its key
// failed, then dead-lettered (ReasonFailed); a later copy of the key runs
// again, once.
func TestSettleDeadLettersAfterMaxFailures(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	policy := onceonly.SettlePolicy{MaxFailures: 2, MinBackoff: 100 * time.Millisecond}
	boom := errors.New("gateway error")

	s := policy.Settle(b.engine.Do(b.ctx, "m", "k", []byte("p"), failing(boom)))
	require.Equal(t, onceonly.Retry, s.Disposition)
	require.Equal(t, 1, s.Failures)
	require.Equal(t, 100*time.Millisecond, s.After)
	require.ErrorIs(t, s.Err, boom)

	s = policy.Settle(b.engine.Do(b.ctx, "m", "k", []byte("p"), failing(boom)))
	require.Equal(t, onceonly.DeadLetter, s.Disposition)
	require.Equal(t, onceonly.ReasonFailed, s.Reason)
	require.Equal(t, 2, s.Failures)
	require.ErrorIs(t, s.Err, boom)

	// A copy published again later runs again: it succeeds here.
	s = policy.Settle(b.engine.Do(b.ctx, "m", "k", []byte("p"), payment(201, "{}")))
	require.Equal(t, onceonly.Ack, s.Disposition)
	require.False(t, s.Outcome.Replayed)
	require.Equal(t, 1, b.payments(t))
}

// TestSettleRetriesAHandOff: an execution handed off after a step whose
// outcome is unknown is no failure: its delivery comes again after
// MinBackoff, and never dead-letters for it.
func TestSettleRetriesAHandOff(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{lease: 2 * time.Second})
	reset := errors.New("connection reset")
	require.NoError(t, b.engine.Register("charge", func(ctx context.Context, _ *onceonly.Execution) (onceonly.Result, error) {
		_, err := onceonly.Step(ctx, "charge", func(context.Context, string) (string, error) { return "", reset })
		return onceonly.Result{}, err
	}))
	policy := onceonly.SettlePolicy{MaxFailures: 1}
	s := policy.Settle(b.engine.Run(b.ctx, "charge", "m", "k", []byte(`{}`)))
	require.Equal(t, onceonly.Retry, s.Disposition)
	require.Equal(t, onceonly.DefaultMinBackoff, s.After)
	require.Zero(t, s.Failures)
	require.ErrorIs(t, s.Err, reset)
}
