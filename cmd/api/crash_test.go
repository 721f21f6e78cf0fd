package main

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/oncetest"
)

// TestKilledMidSlowPaymentRecoversWithinTheLease (a crash blocks a key for
// one lease at most; nothing is left half done): an api is killed with
// SIGKILL while its tok_slow charge is in flight at the gateway. A client
// retrying at another api gets 409 with Retry-After while the dead call's
// lease lasts, then 201 from one execution — within LEASE_TIMEOUT plus the
// gateway's delay and a reconciler interval of the kill — whether the
// gateway is a process of its own (the dead api's call finishes there
// without its client, and the retry gets its charge replayed) or served
// inside each api (the dead api's hold on the downstream key ends with its
// short lease, and the retry charges).
func TestKilledMidSlowPaymentRecoversWithinTheLease(t *testing.T) {
	t.Parallel() // waits on processes and leases more than it computes
	api := binary(t, ".")
	gw := binary(t, "../gateway")
	const (
		lease = 3 * time.Second
		// The charge's hold at the gateway: the window in which the test
		// sees it in flight and kills the victim. Seconds, for a loaded
		// machine: within 1 s the charge could end before the kill.
		slowDelay         = 3 * time.Second
		reconcileInterval = 2 * time.Second
		body              = `{"amount":1234,"currency":"usd","customer":"cus_k","source":"tok_slow"}`
	)
	for _, separate := range []bool{true, false} {
		name := map[bool]string{true: "separate gateway", false: "in-process gateway"}[separate]
		t.Run(name, func(t *testing.T) {
			t.Parallel() // a database and processes of its own
			dbURL := oncetest.DatabaseURL(t)
			env := []string{"DATABASE_URL=" + dbURL, "LEASE_TIMEOUT=" + lease.String(), "RESUME_INTERVAL=300ms",
				"SLOW_GATEWAY_DELAY=" + slowDelay.String()}
			if separate {
				g := oncetest.StartDaemon(t, gw, "DATABASE_URL="+dbURL, "SLOW_GATEWAY_DELAY="+slowDelay.String())
				env = append(env, "GATEWAY_URL=http://"+g.Addr)
			}
			victim := oncetest.StartDaemon(t, api, env...)
			survivor := oncetest.StartDaemon(t, api, env...)
			ctx := oncetest.Context(t)
			pool := oncetest.Pool(t, dbURL)

			go payOnce(ctx, victim.Addr, "slow-1", body) // its answer never comes
			oncetest.Eventually(t, 10*time.Second, "the slow charge in flight at the gateway", func() bool {
				var n int
				err := pool.QueryRow(ctx, `SELECT count(*) FROM gateway.charges WHERE reference = 'acct_demo/slow-1' AND status = 'processing'`).Scan(&n)
				return err == nil && n == 1
			})
			require.NoError(t, victim.Cmd.Process.Kill())
			killedAt := time.Now()

			// A client retrying every 200 ms: 409 with Retry-After until the
			// payment is made, then 201; nothing else.
			var conflicts int
			deadline := killedAt.Add(lease + slowDelay + reconcileInterval)
			for {
				status, answer, header := payOnce(ctx, survivor.Addr, "slow-1", body)
				if status == http.StatusCreated {
					break
				}
				require.Equal(t, http.StatusConflict, status, "while the dead call's lease lasts: %s", answer)
				ra, err := strconv.Atoi(header.Get("Retry-After"))
				require.NoError(t, err, "a 409 carries Retry-After in whole seconds")
				require.Positive(t, ra)
				conflicts++
				require.True(t, time.Now().Before(deadline), "no 201 within %s of the kill (%d answers of 409)", deadline.Sub(killedAt), conflicts)
				select {
				case <-ctx.Done():
					t.Fatal(ctx.Err())
				case <-time.After(200 * time.Millisecond): // the client's pace
				}
			}
			recovered := time.Since(killedAt)
			t.Logf("%s: 201 %s after the kill, after %d answers of 409", name, recovered.Round(10*time.Millisecond), conflicts)
			require.Positive(t, conflicts, "the dead call's lease was respected")

			var charges, rows int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM gateway.charges WHERE reference = 'acct_demo/slow-1' AND charge_id IS NOT NULL`).Scan(&charges))
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM payments WHERE idempotency_key = 'slow-1'`).Scan(&rows))
			require.Equal(t, 1, charges, "one charge")
			require.Equal(t, 1, rows, "one payment row")
		})
	}
}
