package gateway_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/demo/gateway"
	"github.com/onceonly/onceonly/oncetest"
)

// insertProcessing makes key look held by a gateway process whose lease
// ends at now() + until (negative: already over), one that died mid-call.
func insertProcessing(t *testing.T, pool *pgxpool.Pool, key string, req gateway.ChargeRequest, until time.Duration) {
	t.Helper()
	_, err := pool.Exec(t.Context(), `
INSERT INTO gateway.charges (idempotency_key, request_hash, amount, currency, source, reference, status, lease_token, lease_until)
VALUES ($1, $2, $3, $4, $5, $6, 'processing', 'dead-process', now() + $7 * interval '1 millisecond')`,
		key, gateway.RequestHash(req), req.Amount, req.Currency, req.Source, req.Reference, until.Milliseconds())
	require.NoError(t, err)
}

func TestExpiredLeaseIsTakenOver(t *testing.T) {
	t.Parallel()
	pool := migratedDB(t)
	g := serve(t, pool, gateway.Config{})
	ctx := oncetest.Context(t)
	req := gateway.ChargeRequest{Amount: 100, Currency: "usd", Source: "tok_visa", Reference: "acct/dead"}

	insertProcessing(t, pool, "live", req, time.Minute)
	a := post(t, g.URL, "live", chargeBody(100, "tok_visa", "acct/dead"))
	require.Equal(t, http.StatusConflict, a.Code, "a live lease is respected")
	require.Equal(t, "1", a.Header.Get("Retry-After"))
	reused := post(t, g.URL, "live", chargeBody(101, "tok_visa", "acct/dead"))
	require.Equal(t, http.StatusUnprocessableEntity, reused.Code, "reuse is refused even while in flight")

	insertProcessing(t, pool, "dead", req, -time.Second)
	ch, err := g.Client.Charge(ctx, "dead", req)
	require.NoError(t, err, "the call whose process died is taken over")
	require.Equal(t, "succeeded", ch.Status)
	var status, token string
	require.NoError(t, pool.QueryRow(ctx,
		`SELECT status, coalesce(lease_token, '') FROM gateway.charges WHERE idempotency_key = 'dead'`).Scan(&status, &token))
	require.Equal(t, "succeeded", status)
	require.Empty(t, token)
	replay, err := g.Client.Charge(ctx, "dead", req)
	require.NoError(t, err)
	require.Equal(t, ch, replay)
}

// TestStaleCallDoesNotCharge: a call that outlived its lease, whose key was
// taken over and charged meanwhile, charges nothing and answers as the
// charge did.
func TestStaleCallDoesNotCharge(t *testing.T) {
	t.Parallel()
	pool := migratedDB(t)
	h, err := gateway.NewHandler(gateway.Config{Pool: pool, Logger: testLogger(t)})
	require.NoError(t, err)
	ctx := oncetest.Context(t)
	req := gateway.ChargeRequest{Amount: 100, Currency: "usd", Source: "tok_visa", Reference: "acct/stale"}

	owned, err := gateway.Claim(ctx, h, "stale", req, "old", time.Millisecond)
	require.NoError(t, err)
	require.True(t, owned)
	oncetest.Eventually(t, 5*time.Second, "the old call's lease over", func() bool {
		var over bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT lease_until < now() FROM gateway.charges WHERE idempotency_key = 'stale'`).Scan(&over))
		return over
	})
	took, err := gateway.TakeOver(ctx, h, "stale", "new", time.Minute)
	require.NoError(t, err)
	require.True(t, took)
	status, fresh, replay, err := gateway.Process(ctx, h, "stale", "new", req)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status)
	require.False(t, replay)

	status, stale, replay, err := gateway.Process(ctx, h, "stale", "old", req)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status)
	require.True(t, replay)
	require.Equal(t, fresh, stale, "the stale call answers the charge that was made")
	require.Equal(t, 1, countRows(t, pool))
}

// TestLiveCallKeepsItsShortLease: a tok_slow call that works for many times
// its lease keeps its key (it renews its hold) — every other call with the
// key meanwhile gets 409 — and charges once; its hold ends when it charged.
func TestLiveCallKeepsItsShortLease(t *testing.T) {
	t.Parallel()
	pool := migratedDB(t)
	const lease, delay = 900 * time.Millisecond, 3 * time.Second // three leases and more
	g := serve(t, pool, gateway.Config{SlowDelay: delay, Lease: lease})
	ctx := oncetest.Context(t)
	req := gateway.ChargeRequest{Amount: 300, Currency: "usd", Source: "tok_slow", Reference: "acct/held"}

	type result struct {
		ch  gateway.Charge
		err error
	}
	done := make(chan result, 1)
	go func() {
		ch, err := g.Client.Charge(ctx, "held", req)
		done <- result{ch, err}
	}()
	oncetest.Eventually(t, 5*time.Second, "the slow call owns its key", func() bool {
		return readRow(t, pool, "held").Status == "processing"
	})
	// Duplicates until the slow call answers: each must find it in flight,
	// however many leases have passed.
	duplicates := 0
	for {
		select {
		case r := <-done:
			require.NoError(t, r.err)
			require.Equal(t, "succeeded", r.ch.Status)
			require.GreaterOrEqual(t, duplicates, 5, "duplicates were sent over several leases")
			replay, err := g.Client.Charge(ctx, "held", req)
			require.NoError(t, err)
			require.Equal(t, r.ch, replay)
			require.EqualValues(t, 1, counter(t, g.Reg, "gateway_charges_total", map[string]string{"status": "succeeded"}))
			return
		default:
		}
		dup := post(t, g.URL, "held", chargeBody(300, "tok_slow", "acct/held"))
		if dup.Code == http.StatusCreated {
			// The slow call may have charged between the select and the
			// post: a replay is then right, anything else is a takeover.
			require.Equal(t, "true", dup.Header.Get("Idempotent-Replayed"), "a live call's key was taken over")
			continue
		}
		require.Equal(t, http.StatusConflict, dup.Code, dup.Body)
		duplicates++
		time.Sleep(100 * time.Millisecond) // the pace of the duplicates, not a wait for an event
	}
}
