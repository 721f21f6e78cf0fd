package onceonly_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/oncetest"
)

// TestCommitThatLandedIsNotLost: a two-phase execution whose commit has
// landed, but whose answer is still on its way back, is told its result,
// not ErrLeaseLost. Meanwhile the lease keeper's next renewal finds the key
// completed, no longer in progress under the execution's owner, and gives
// the lease up; that must not cut the commit's answer off (the history
// checker's "committed, but its caller told lost"). The engine's pool
// reaches Postgres through a proxy that delays every chunk past a renewal;
// the keeper's own connection does not.
func TestCommitThatLandedIsNotLost(t *testing.T) {
	t.Parallel()
	const (
		lease = 3 * time.Second // renewed every second
		// The COMMIT lands this long after it is sent, and its answer as
		// long after: a renewal falls in between, and the whole round trip
		// is shorter than a lease.
		delay = 1200 * time.Millisecond
	)
	ctx := oncetest.Context(t)
	url := oncetest.DatabaseURL(t)
	proxy, proxied := oncetest.NewFaultProxyFor(t, url)
	via, err := pgx.ParseConfig(proxied)
	require.NoError(t, err)
	pc, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	// The pool's connection goes through the proxy; the keeper's, made
	// from the pool's ConnConfig, go straight to Postgres. One connection,
	// so the statements the warm-up prepared are prepared for the COMMIT's
	// round trip too (one round trip, not a prepare first).
	pc.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
		cc.Host, cc.Port, cc.Fallbacks = via.Host, via.Port, nil
		return nil
	}
	pc.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	e, err := onceonly.New(onceonly.Config{Pool: pool, LeaseTimeout: lease, TwoPhase: true})
	require.NoError(t, err)
	t.Cleanup(e.Close)
	t.Cleanup(func() { proxy.SetMode(oncetest.Pass) })

	_, err = e.Do(ctx, "m", "warm-up", []byte("p"), payment(201, `{"id":0}`))
	require.NoError(t, err)
	out, err := e.Do(ctx, "m", "k", []byte("p"), func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
		res, err := payment(201, `{"id":1}`)(ctx, tx)
		proxy.SetLatency(delay)
		return res, err
	})
	proxy.SetMode(oncetest.Pass)
	var status string
	var payments int
	require.NoError(t, pool.QueryRow(ctx, `SELECT status, (SELECT count(*) FROM payments) FROM idempotency_keys WHERE key = 'k'`).Scan(&status, &payments))
	require.Equal(t, "completed", status)
	require.Equal(t, 2, payments, "the warm-up's and this execution's")
	require.NoError(t, err, "the commit landed")
	require.False(t, out.Replayed)
	require.Equal(t, 201, out.Status)
}
