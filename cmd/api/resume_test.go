package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/oncetest"
)

// payOnce sends one payment and returns its answer; a request that gets no
// answer returns status 0 and the error. It asserts nothing, so it can run
// outside the test's goroutine.
func payOnce(ctx context.Context, addr, key, body string) (int, string, http.Header) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/payments", strings.NewReader(body))
	if err != nil {
		return 0, err.Error(), nil
	}
	req.Header.Set("Authorization", "Bearer sk_test_demo")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error(), nil
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(raw), res.Header
}

// TestKilledAfterTheGatewayChargedIsFinishedWithoutARetry (nothing is left
// half done): an api is killed with SIGKILL while its gateway call hangs
// after charging. No client retries; another api finishes the payment on
// its own, within the lease and its resume interval, with the charge the
// gateway made, and a later retry is replayed.
func TestKilledAfterTheGatewayChargedIsFinishedWithoutARetry(t *testing.T) {
	t.Parallel() // waits on processes and leases more than it computes
	api := binary(t, ".")
	gw := binary(t, "../gateway")
	dbURL := oncetest.DatabaseURL(t)
	g := oncetest.StartDaemon(t, gw, "DATABASE_URL="+dbURL, "GATEWAY_FAULTS=charge_then_hang=1", "GATEWAY_HANG=1500ms")
	apiEnv := []string{"DATABASE_URL=" + dbURL, "GATEWAY_URL=http://" + g.Addr, "LEASE_TIMEOUT=2s", "RESUME_INTERVAL=200ms", "GATEWAY_TIMEOUT=5s"}
	a := oncetest.StartDaemon(t, api, apiEnv...)
	b := oncetest.StartDaemon(t, api, apiEnv...)
	addrA, addrB := a.Addr, b.Addr

	const body = `{"amount":700,"currency":"eur","customer":"cus_k","source":"tok_visa"}`
	ctx := oncetest.Context(t)
	go payOnce(ctx, addrA, "killed-1", body) // its answer never comes
	pool := oncetest.Pool(t, dbURL)
	var chargeID string
	oncetest.Eventually(t, 10*time.Second, "the gateway charged", func() bool {
		err := pool.QueryRow(ctx, `SELECT charge_id FROM gateway.charges WHERE reference = 'acct_demo/killed-1' AND charge_id IS NOT NULL`).Scan(&chargeID)
		return err == nil
	})
	require.NoError(t, a.Cmd.Process.Kill()) // between the gateway's charge and the commit
	killedAt := time.Now()

	var paymentCharge string
	oncetest.Eventually(t, 15*time.Second, "the payment finished without a retry", func() bool {
		err := pool.QueryRow(ctx, `SELECT charge_id FROM payments WHERE idempotency_key = 'killed-1'`).Scan(&paymentCharge)
		return err == nil
	})
	t.Logf("finished %s after the kill", time.Since(killedAt).Round(10*time.Millisecond))
	require.Equal(t, chargeID, paymentCharge, "the payment records the charge the gateway made")
	var charges, rows int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM gateway.charges WHERE reference = 'acct_demo/killed-1'`).Scan(&charges))
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM payments WHERE idempotency_key = 'killed-1'`).Scan(&rows))
	require.Equal(t, 1, charges)
	require.Equal(t, 1, rows)
	require.Contains(t, b.Logs.String(), "execution resumed")

	status, answer, header := payOnce(ctx, addrB, "killed-1", body)
	require.Equal(t, http.StatusCreated, status, answer)
	require.Equal(t, "true", header.Get("Idempotent-Replayed"))
	require.Contains(t, answer, `"charge":"`+chargeID+`"`)
}

// TestPausedPastItsLeaseRecordsNothing (no concurrent execution): an api is
// paused (SIGSTOP) during a slow gateway call, past its lease. A retry at
// another api takes the key over (or that api's own resumption does,
// first); the gateway turns its call with the same downstream key away
// while the first is in flight. When the paused api wakes up, the gateway's
// answer waiting for it, it can no longer record the step or commit (its
// client gets no 201): one charge, one payment row, with that charge.
func TestPausedPastItsLeaseRecordsNothing(t *testing.T) {
	t.Parallel() // waits on processes and leases more than it computes
	api := binary(t, ".")
	gw := binary(t, "../gateway")
	dbURL := oncetest.DatabaseURL(t)
	// A's call outlasts the retry's whole request (its takeover, the api's
	// own calls to the gateway a second apart, the look-up), which starts
	// as A's lease ends, a second in.
	g := oncetest.StartDaemon(t, gw, "DATABASE_URL="+dbURL, "SLOW_GATEWAY_DELAY=6s")
	apiEnv := []string{"DATABASE_URL=" + dbURL, "GATEWAY_URL=http://" + g.Addr, "LEASE_TIMEOUT=1s", "RESUME_INTERVAL=200ms", "GATEWAY_TIMEOUT=10s"}
	a := oncetest.StartDaemon(t, api, apiEnv...)
	addrA, addrB := a.Addr, oncetest.StartDaemon(t, api, apiEnv...).Addr

	const body = `{"amount":900,"currency":"eur","customer":"cus_p","source":"tok_slow"}`
	ctx := oncetest.Context(t)
	pool := oncetest.Pool(t, dbURL)
	first := make(chan int, 1)
	go func() {
		status, _, _ := payOnce(ctx, addrA, "paused-1", body)
		first <- status
	}()
	oncetest.Eventually(t, 10*time.Second, "A has claimed the key and called the gateway", func() bool {
		var n int
		return pool.QueryRow(ctx, `SELECT count(*) FROM gateway.charges WHERE reference = 'acct_demo/paused-1'`).Scan(&n) == nil && n > 0
	})
	require.NoError(t, a.Cmd.Process.Signal(syscall.SIGSTOP))
	oncetest.Eventually(t, 10*time.Second, "A's lease over in Postgres", func() bool {
		var over bool
		return pool.QueryRow(ctx, `SELECT lease_expires_at <= now() FROM idempotency_keys WHERE key = 'paused-1'`).Scan(&over) == nil && over
	})
	status, answer, _ := payOnce(ctx, addrB, "paused-1", body)
	require.Contains(t, []int{http.StatusBadGateway, http.StatusConflict}, status, "the takeover finds the first call still in flight at the gateway: %s", answer)
	// A wakes up with the gateway's answer to its call waiting for it.
	oncetest.Eventually(t, 20*time.Second, "the gateway charged A's call", func() bool {
		var n int
		return pool.QueryRow(ctx, `SELECT count(*) FROM gateway.charges WHERE reference = 'acct_demo/paused-1' AND charge_id IS NOT NULL`).Scan(&n) == nil && n > 0
	})
	require.NoError(t, a.Cmd.Process.Signal(syscall.SIGCONT))
	woken := <-first
	t.Logf("the paused api answered %d", woken)
	require.NotEqual(t, http.StatusCreated, woken, "the paused api committed its payment after its lease ended")
	// A answered its client, so its execution is over; once A has exited,
	// no late write of it can land after the counts below.
	require.NoError(t, a.Cmd.Process.Signal(syscall.SIGTERM))
	_ = a.Cmd.Wait()

	var paymentCharge string
	oncetest.Eventually(t, 20*time.Second, "the payment is finished", func() bool {
		return pool.QueryRow(ctx, `SELECT charge_id FROM payments WHERE idempotency_key = 'paused-1'`).Scan(&paymentCharge) == nil
	})
	var charges, rows int
	var chargeID string
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), max(charge_id) FROM gateway.charges WHERE reference = 'acct_demo/paused-1'`).Scan(&charges, &chargeID))
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM payments WHERE idempotency_key = 'paused-1'`).Scan(&rows))
	require.Equal(t, 1, charges, "one charge")
	require.Equal(t, 1, rows, "one payment row")
	require.Equal(t, chargeID, paymentCharge)
}
