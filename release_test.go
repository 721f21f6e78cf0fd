package onceonly_test

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/oncetest"
)

// TestHandOffLandsOncePostgresIsBack: an execution whose step's outcome is
// unknown, and whose hand-off Postgres refused (it was what failed), hands
// its key off as soon as Postgres answers again — long before its lease
// would have ended — so the client's next retry takes the key over at once.
func TestHandOffLandsOncePostgresIsBack(t *testing.T) {
	t.Parallel()
	dbURL := oncetest.DatabaseURL(t)
	proxy, proxied := oncetest.NewFaultProxyFor(t, dbURL)
	ctx := oncetest.Context(t)

	const lease = 30 * time.Second
	engine, err := onceonly.New(onceonly.Config{Pool: oncetest.Pool(t, proxied), LeaseTimeout: lease, TwoPhase: true, Logger: oncetest.QuietLogger()})
	require.NoError(t, err)
	t.Cleanup(engine.Close)
	cut := true
	require.NoError(t, engine.Register("charge", func(ctx context.Context, x *onceonly.Execution) (onceonly.Result, error) {
		_, err := onceonly.Step(ctx, "call", func(context.Context, string) (string, error) {
			if cut {
				// Postgres goes away while the call is out: its answer is
				// lost, and the hand-off cannot land either.
				proxy.SetMode(oncetest.Reset)
				return "", errors.New("connection reset")
			}
			return "ch_1", nil
		})
		if err != nil {
			return onceonly.Result{Status: http.StatusBadGateway}, nil //nolint:nilerr // the step's outcome is unknown: answered, not raised
		}
		return onceonly.Result{Status: http.StatusCreated, Body: []byte(`{"charge":"ch_1"}`)}, nil
	}))

	out, err := engine.Run(ctx, "charge", "acct_1", "k1", []byte(`{}`))
	require.NoError(t, err)
	require.Equal(t, http.StatusBadGateway, out.Status)
	proxy.SetMode(oncetest.Pass)
	cut = false

	check := oncetest.Pool(t, dbURL)
	// Within the 30 s lease (the claim), with room for the retries'
	// reconnects through the proxy on a loaded machine.
	oncetest.Eventually(t, 20*time.Second, "the key handed off once Postgres answered", func() bool {
		var handedOff bool
		err := check.QueryRow(ctx, `SELECT lease_expires_at <= now() FROM idempotency_keys WHERE scope = 'acct_1' AND key = 'k1'`).Scan(&handedOff)
		return err == nil && handedOff
	})
	out, err = engine.Run(ctx, "charge", "acct_1", "k1", []byte(`{}`))
	require.NoError(t, err, "the retry takes the key over at once")
	require.Equal(t, http.StatusCreated, out.Status)
}

// TestLeaseLostInAPartitionIsReleasedWhenItHeals: an execution cut off from
// Postgres (a blackhole) stops when its lease runs out by its own clock. A
// renewal it sent into the partition lands when the network heals, while
// Postgres's lease still runs, and would extend the dead holder's lease by
// a whole lease; the engine releases the key in the background instead, so
// it is free soon after the heal, not a lease later.
func TestLeaseLostInAPartitionIsReleasedWhenItHeals(t *testing.T) {
	t.Parallel()
	dbURL := oncetest.DatabaseURL(t)
	proxy, proxied := oncetest.NewFaultProxyFor(t, dbURL)
	const lease = 3 * time.Second
	engine, err := onceonly.New(onceonly.Config{Pool: oncetest.Pool(t, proxied), LeaseTimeout: lease, TwoPhase: true, Logger: oncetest.QuietLogger()})
	require.NoError(t, err)
	t.Cleanup(engine.Close)
	ctx := oncetest.Context(t)
	check := oncetest.Pool(t, dbURL)
	leaseEnd := func() time.Time {
		var end time.Time
		require.NoError(t, check.QueryRow(ctx, `SELECT lease_expires_at FROM idempotency_keys WHERE scope = 'acct_1' AND key = 'cut'`).Scan(&end))
		return end
	}

	claimed := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := engine.Do(ctx, "acct_1", "cut", []byte(`{}`), func(ctx context.Context, _ pgx.Tx) (onceonly.Result, error) {
			close(claimed)
			<-ctx.Done() // a long handler: it ends when its lease is lost
			return onceonly.Result{}, context.Cause(ctx)
		})
		done <- err
	}()
	<-claimed
	// Cut Postgres off once a renewal has landed, so the lease Postgres
	// holds outlasts the holder's own view of it.
	// The lease's end moves (the time left grows only for the moment
	// after each renewal, which a loaded machine's polls can miss).
	claimedEnd := leaseEnd()
	oncetest.Eventually(t, lease, "a renewal landed", func() bool { return leaseEnd().After(claimedEnd) })
	proxy.SetMode(oncetest.Blackhole)
	err = <-done
	require.ErrorIs(t, err, onceonly.ErrLeaseLost)
	proxy.SetMode(oncetest.Pass)
	healed := time.Now()

	oncetest.Eventually(t, lease/2, "the key released after the heal", func() bool {
		var takeable bool
		err := check.QueryRow(ctx, `SELECT status = 'failed' OR lease_expires_at <= now()
			FROM idempotency_keys WHERE scope = 'acct_1' AND key = 'cut'`).Scan(&takeable)
		return err == nil && takeable
	})
	t.Logf("released %s after the heal", time.Since(healed).Round(10*time.Millisecond))
}

// TestStepTakenThenPostgresLostIsHandedOff (I12): a handler whose step had
// its effect, and whose final write Postgres refused (it answers 503), is
// not failed once Postgres is back — a failed key forgets its steps, and
// with no client retry the effect would stay without its row — but handed
// off, so a resumption finishes it with the recorded outcome.
func TestStepTakenThenPostgresLostIsHandedOff(t *testing.T) {
	t.Parallel()
	dbURL := oncetest.DatabaseURL(t)
	proxy, proxied := oncetest.NewFaultProxyFor(t, dbURL)
	engine, err := onceonly.New(onceonly.Config{Pool: oncetest.Pool(t, proxied), LeaseTimeout: 30 * time.Second, Logger: oncetest.QuietLogger()})
	require.NoError(t, err)
	t.Cleanup(engine.Close)
	ctx := oncetest.Context(t)
	var cut atomic.Bool
	require.NoError(t, engine.Register("charge", func(ctx context.Context, x *onceonly.Execution) (onceonly.Result, error) {
		charge, err := onceonly.Step(ctx, "call", func(context.Context, string) (string, error) { return "ch_1", nil })
		if err != nil {
			return onceonly.Result{Status: http.StatusBadGateway}, nil //nolint:nilerr // answered, as the demo does
		}
		if cut.CompareAndSwap(false, true) {
			proxy.SetMode(oncetest.Reset) // Postgres goes away before the first final write
		}
		tx, err := x.Tx(ctx)
		if err == nil {
			_, err = tx.Exec(ctx, `SELECT 1`) // the final write
		}
		if err != nil {
			return onceonly.Result{Status: http.StatusServiceUnavailable}, nil //nolint:nilerr // answered, as the demo does
		}
		return onceonly.Result{Status: http.StatusCreated, Body: []byte(`{"charge":"` + charge + `"}`)}, nil
	}))

	out, err := engine.Run(ctx, "charge", "acct_1", "k2", []byte(`{}`))
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, out.Status)
	proxy.SetMode(oncetest.Pass)

	check := oncetest.Pool(t, dbURL)
	// The hand-off lands from the background once a reconnect through the
	// proxy works: seconds on a loaded machine, within the 30 s lease.
	oncetest.Eventually(t, 20*time.Second, "the key handed off, its steps kept", func() bool {
		var handedOff bool
		err := check.QueryRow(ctx, `SELECT status = 'in_progress' AND lease_expires_at <= now() AND steps IS NOT NULL
			FROM idempotency_keys WHERE scope = 'acct_1' AND key = 'k2'`).Scan(&handedOff)
		return err == nil && handedOff
	})
	n, err := engine.ResumeOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n, "a resumption finishes it")
	var status string
	require.NoError(t, check.QueryRow(ctx, `SELECT status FROM idempotency_keys WHERE scope = 'acct_1' AND key = 'k2'`).Scan(&status))
	require.Equal(t, "completed", status)
}
