package onceonly_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/oncetest"
)

// remote is the external system of these tests: it applies each
// downstream key once, as a gateway that deduplicates does, and counts
// every call and every effect.
type remote struct {
	mu      sync.Mutex
	calls   int
	effects map[string]int
}

func newRemote() *remote { return &remote{effects: map[string]int{}} }

// apply records a call with key and returns the effect's id.
func (r *remote) apply(key string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	r.effects[key]++
	return "fx_" + key[len(key)-6:]
}

func (r *remote) stats() (calls, keys int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls, len(r.effects)
}

// ledgerHandler charges through a step and writes the effect's id into the
// payments table in the final transaction. fail, when set, decides per
// attempt whether the step's call loses its answer (outcome unknown) or
// the final write fails.
type ledgerHandler struct {
	remote      *remote
	attempts    atomic.Int32
	loseAnswer  func(attempt int32) bool
	failCommit  func(attempt int32) bool
	beforeWrite func(ctx context.Context)
	sql         bool // write through SQLTx (Config.DB), not Tx
}

func (h *ledgerHandler) run(ctx context.Context, x *onceonly.Execution) (onceonly.Result, error) {
	attempt := h.attempts.Add(1)
	id, err := onceonly.Step(ctx, "charge", func(ctx context.Context, key string) (string, error) {
		id := h.remote.apply(key)
		if h.loseAnswer != nil && h.loseAnswer(attempt) {
			return "", errors.New("connection reset after the call reached the remote")
		}
		return id, nil
	})
	if err != nil {
		// The handler answers the failed call; the engine keeps the key in
		// progress while the step is unsettled.
		return onceonly.Result{Status: http.StatusBadGateway, Body: fmt.Appendf(nil, `{"error":%q}`, err.Error())}, nil
	}
	if h.beforeWrite != nil {
		h.beforeWrite(ctx)
	}
	if h.failCommit != nil && h.failCommit(attempt) {
		return onceonly.Result{}, errors.New("insert failed")
	}
	if err := h.write(ctx, `INSERT INTO payments (id, merchant_id, idempotency_key, amount, currency, customer, status, charge_id)
		VALUES ('pay_' || $1, $2, $3, 1, 'usd', 'c', 'succeeded', $4)`, x.Key(), x.Scope(), x.Key(), id); err != nil {
		return onceonly.Result{}, err
	}
	return onceonly.Result{Status: http.StatusCreated, Body: []byte(`{"charge":"` + id + `"}`)}, nil
}

// write runs statement in the execution's transaction: SQLTx's with h.sql,
// else Tx's.
func (h *ledgerHandler) write(ctx context.Context, statement string, args ...any) error {
	if h.sql {
		tx, err := onceonly.SQLTx(ctx)
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, statement, args...)
		return err
	}
	tx, err := onceonly.Tx(ctx)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, statement, args...)
	return err
}

// paymentRows counts the payment rows of key.
func paymentRows(t *testing.T, ctx context.Context, pool *pgxpool.Pool, key string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM payments WHERE idempotency_key = $1`, key).Scan(&n))
	return n
}

func TestStepOutcomeIsReusedByTheRetry(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{lease: 2 * time.Second})
	h := &ledgerHandler{remote: newRemote(), failCommit: func(a int32) bool { return a == 1 }}
	require.NoError(t, b.engine.Register("ledger", h.run))

	_, err := b.engine.Run(b.ctx, "ledger", "m", "k1", []byte(`{"amount":1}`))
	require.Error(t, err, "the final write failed")
	require.Equal(t, "in_progress", b.keyStatus(t, "k1"), "a key whose step had an effect is handed off, not failed")

	out, err := b.engine.Run(b.ctx, "ledger", "m", "k1", []byte(`{"amount":1}`))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, out.Status)
	calls, keys := h.remote.stats()
	require.Equal(t, 1, calls, "the recorded outcome is reused: the remote is not called again")
	require.Equal(t, 1, keys)
	require.Equal(t, 1, paymentRows(t, b.ctx, b.pool, "k1"))

	again, err := b.engine.Run(b.ctx, "ledger", "m", "k1", []byte(`{"amount":1}`))
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, out.Body, again.Body)
}

func TestUnknownOutcomeIsSettledByTheEngineItself(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{lease: 2 * time.Second})
	h := &ledgerHandler{remote: newRemote(), loseAnswer: func(a int32) bool { return a == 1 }}
	require.NoError(t, b.engine.Register("ledger", h.run))

	out, err := b.engine.Run(b.ctx, "ledger", "m", "k2", []byte(`{}`))
	require.NoError(t, err)
	require.Equal(t, http.StatusBadGateway, out.Status)
	require.Equal(t, "in_progress", b.keyStatus(t, "k2"), "an unsettled step is not failed")

	// No client retries: a live engine finishes the execution on its own.
	resumer, err := onceonly.New(onceonly.Config{Pool: b.pool, Redis: b.rdb, RedisPrefix: b.prefix, LeaseTimeout: 2 * time.Second})
	require.NoError(t, err)
	t.Cleanup(resumer.Close)
	require.NoError(t, resumer.Register("ledger", h.run))
	n, err := resumer.ResumeOnce(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, "completed", b.keyStatus(t, "k2"))
	calls, keys := h.remote.stats()
	require.Equal(t, 2, calls, "the unknown outcome was settled by calling again")
	require.Equal(t, 1, keys, "with the same downstream key")
	require.Equal(t, 1, paymentRows(t, b.ctx, b.pool, "k2"))

	replay, err := b.engine.Run(b.ctx, "ledger", "m", "k2", []byte(`{}`))
	require.NoError(t, err)
	require.True(t, replay.Replayed, "a client that retries later gets the replay")
	require.Equal(t, http.StatusCreated, replay.Status)
}

// TestResumedPanicDoesNotCrash: a handler that panics in a resumption (a
// router that needs what its middlewares set, say) does not take the
// process down: the key is handed off again, the panic logged.
func TestResumedPanicDoesNotCrash(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{lease: 2 * time.Second})
	var runs atomic.Int32
	require.NoError(t, b.engine.Register("panics", func(ctx context.Context, _ *onceonly.Execution) (onceonly.Result, error) {
		if runs.Add(1) > 1 {
			panic("resumed without its router")
		}
		if _, err := onceonly.Step(ctx, "s", func(context.Context, string) (int, error) { return 1, nil }); err != nil {
			return onceonly.Result{}, err
		}
		return onceonly.Result{}, errors.New("after the step")
	}))
	_, err := b.engine.Run(b.ctx, "panics", "m", "k-panic", []byte(`{}`))
	require.Error(t, err)
	require.Equal(t, "in_progress", b.keyStatus(t, "k-panic"), "handed off for a resumption")
	n, err := b.engine.ResumeOnce(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.EqualValues(t, 2, runs.Load())
	require.Equal(t, "in_progress", b.keyStatus(t, "k-panic"), "handed off again")
}

func TestResumeSkipsExecutionsWithoutSteps(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{lease: 2 * time.Second})
	require.NoError(t, b.engine.Register("plain", func(ctx context.Context, x *onceonly.Execution) (onceonly.Result, error) {
		return onceonly.Result{}, errors.New("boom")
	}))
	_, err := b.engine.Run(b.ctx, "plain", "m", "k3", []byte(`{}`))
	require.Error(t, err)
	require.Equal(t, "failed", b.keyStatus(t, "k3"), "no step started: the key fails as before")
	n, err := b.engine.ResumeOnce(b.ctx)
	require.NoError(t, err)
	require.Zero(t, n)
}

// TestLeaseSurvivesAStarvedPool: the handler's pool has one connection and
// the handler holds it for three leases; renewals run on a connection of
// their own, so duplicates never take the key over and the remote is
// called once. The lease is long enough for a renewal to land on a loaded
// machine (half of it is left when the renewal is sent).
func TestLeaseSurvivesAStarvedPool(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	cfg, err := pgxpool.ParseConfig(b.pool.Config().ConnString())
	require.NoError(t, err)
	cfg.MaxConns = 1
	starved, err := pgxpool.NewWithConfig(b.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(starved.Close)
	const lease = 2 * time.Second
	holder, err := onceonly.New(onceonly.Config{Pool: starved, LeaseTimeout: lease})
	require.NoError(t, err)
	t.Cleanup(holder.Close)

	h := &ledgerHandler{remote: newRemote(), beforeWrite: func(ctx context.Context) {
		conn, err := starved.Acquire(ctx) // the pool's only connection, held past several leases
		if err != nil {
			return
		}
		time.Sleep(3 * lease) // the hold is the condition under test: several leases without the pool
		conn.Release()
	}}
	require.NoError(t, holder.Register("ledger", h.run))
	dup, err := onceonly.New(onceonly.Config{Pool: b.pool, LeaseTimeout: lease})
	require.NoError(t, err)
	t.Cleanup(dup.Close)
	require.NoError(t, dup.Register("ledger", h.run))

	done := make(chan error, 1)
	go func() {
		_, err := holder.Run(b.ctx, "ledger", "m", "k4", []byte(`{}`))
		done <- err
	}()
	oncetest.Eventually(t, 5*time.Second, "the holder called the remote", func() bool {
		calls, _ := h.remote.stats()
		return calls == 1
	})
	var inFlight int
	for {
		select {
		case err := <-done:
			require.NoError(t, err)
			calls, _ := h.remote.stats()
			require.Equal(t, 1, calls, "never a second call beside a live one")
			require.Equal(t, 1, paymentRows(t, b.ctx, b.pool, "k4"))
			require.Positive(t, inFlight)
			return
		case <-time.After(20 * time.Millisecond):
		}
		if _, ok := dup.ResumeOnce(b.ctx); ok != nil {
			t.Fatal(ok)
		}
		_, err := dup.Run(b.ctx, "ledger", "m", "k4", []byte(`{}`))
		if _, busy := onceonly.IsInFlight(err); busy {
			inFlight++
			continue
		}
		if err == nil {
			break // the holder finished first: replayed
		}
		require.NoError(t, err)
	}
	require.NoError(t, <-done)
	calls, _ := h.remote.stats()
	require.Equal(t, 1, calls)
}

// TestHolderWithoutPostgresStopsBeforeItsLeaseEnds: Postgres goes away
// under a running handler; its lease cannot be renewed, so the engine
// cancels it a margin before the lease ends, and it can no longer record a
// step or commit. "Ends" is Postgres's lease_expires_at (read once Postgres
// is back), which a renewal that landed before Postgres went may have
// moved: the holder stops before it, by the margin less what a loaded
// machine's scheduling eats.
func TestHolderWithoutPostgresStopsBeforeItsLeaseEnds(t *testing.T) {
	t.Parallel()
	srv, pool := privatePostgres(t)
	const lease = 3 * time.Second // the margin, lease/6, dwarfs a loaded machine's lateness
	const margin = lease / 6
	e, err := onceonly.New(onceonly.Config{Pool: pool, LeaseTimeout: lease, TwoPhase: true, Logger: oncetest.QuietLogger()})
	require.NoError(t, err)
	t.Cleanup(e.Close)
	ctx := oncetest.Context(t)

	stopped := make(chan time.Time, 1)
	down := make(chan struct{})
	var stepErr error
	require.NoError(t, e.Register("wait", func(ctx context.Context, x *onceonly.Execution) (onceonly.Result, error) {
		go func() {
			srv.Stop()
			close(down)
		}()
		select {
		case <-ctx.Done():
		case <-time.After(3 * lease): // never stopped: the assertions below fail
		}
		stopped <- time.Now()
		_, stepErr = onceonly.Step(ctx, "late", func(context.Context, string) (int, error) { return 1, nil })
		return onceonly.Result{Status: 201}, nil
	}))
	_, err = e.Run(ctx, "wait", "m", "k5", []byte(`{}`))
	require.ErrorIs(t, err, onceonly.ErrLeaseLost)
	at := <-stopped
	require.ErrorIs(t, stepErr, onceonly.ErrLeaseLost, "a holder past its lease records no step")

	<-down
	// The engine ends the release of the lost key it retries in the
	// background (it would land once Postgres is back, and clear the
	// lease this test reads).
	e.Close()
	srv.Start()
	conn, err := pgx.Connect(ctx, srv.URL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.WithoutCancel(ctx)) })
	var end time.Time
	require.NoError(t, conn.QueryRow(ctx, `SELECT lease_expires_at FROM idempotency_keys WHERE scope = 'm' AND key = 'k5'`).Scan(&end))
	t.Logf("stopped %s before the lease ended (margin %s)", end.Sub(at).Round(time.Millisecond), margin)
	require.True(t, at.Before(end), "stopped at %s, after the lease ended at %s", at.Format(time.RFC3339Nano), end.Format(time.RFC3339Nano))
	require.GreaterOrEqual(t, end.Sub(at), margin/2, "stopped %s before the lease ended: the margin is %s", end.Sub(at), margin)
}
