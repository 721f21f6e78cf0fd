package onceriver_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/demo/demotest"
	"github.com/onceonly/onceonly/demo/gateway"
	"github.com/onceonly/onceonly/onceriver/internal/chargejob"
	"github.com/onceonly/onceonly/oncetest"
)

// killFigures is what a kill left behind, counted once the process is dead.
type killFigures struct {
	stranded    int // jobs the dead process had running
	uncommitted int // gateway charges made (or under way) without their ledger row
}

// TestKilledWorkersChargeOncePerOrder kills River worker processes with
// SIGKILL mid-job, again and again, and starts a new one each time: half the
// kills when a charge is made at the gateway and its ledger row is not yet
// committed, half at a random moment of a running job. Some orders are
// enqueued twice, before and after the kills. Once River has rescued the
// stranded jobs and every job is completed: one gateway charge per order,
// one ledger row per charge (with that charge), and no job discarded or
// cancelled.
func TestKilledWorkersChargeOncePerOrder(t *testing.T) {
	began := time.Now()
	bin := oncetest.BuildBinary(t, "./internal/testworker")
	built := time.Now()
	dbURL := oncetest.DatabaseURL(t)
	pool := oncetest.Pool(t, dbURL)
	ctx := oncetest.Context(t)
	require.NoError(t, migrateRiver(ctx, pool))
	require.NoError(t, chargejob.Migrate(ctx, pool))
	// A third of the charges hang for a second after charging: the window
	// where a dead worker leaves a charge without its ledger row.
	gw := demotest.Gateway(t, pool, gateway.Config{
		Latency: 30 * time.Millisecond, Faults: gateway.Faults{ChargeThenHang: 0.3}, Hang: time.Second,
	})
	_, prefix := oncetest.Redis(t)
	env := []string{
		"DATABASE_URL=" + dbURL, "GATEWAY_URL=" + gw.BaseURL, "REDIS_URL=" + oncetest.RedisURL(t), "REDIS_PREFIX=" + prefix,
		"LEASE_TIMEOUT=4s", "RESUME_INTERVAL=200ms", "JOB_TIMEOUT=3s", "RESCUE_AFTER=5s", "RETRY_DELAY=200ms",
		"STEP_PAUSE=200ms", "MAX_WORKERS=4",
	}
	var procs []*oncetest.Daemon
	t.Cleanup(func() {
		if t.Failed() {
			for i, p := range procs {
				t.Logf("worker w%d logs:\n%s", i+1, p.Logs.String())
			}
		}
	})
	start := func() (*oncetest.Daemon, string, time.Time) {
		id := "w" + strconv.Itoa(len(procs)+1)
		d := oncetest.StartDaemon(t, bin, append(env, "WORKER_ID="+id)...)
		procs = append(procs, d)
		var now time.Time
		require.NoError(t, pool.QueryRow(ctx, `SELECT now()`).Scan(&now))
		return d, id, now
	}

	inserter, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: oncetest.QuietLogger()})
	require.NoError(t, err)
	const orders, kills = 24, 4
	enqueue := func(ids ...int) {
		params := make([]river.InsertManyParams, 0, len(ids))
		for _, i := range ids {
			params = append(params, river.InsertManyParams{Args: chargejob.Args{
				OrderID: fmt.Sprintf("order-%02d", i), Amount: int64(100 + i), Currency: "eur",
			}})
		}
		_, err := inserter.InsertMany(ctx, params)
		require.NoError(t, err)
	}
	first := make([]int, 0, orders+6)
	for i := range orders {
		first = append(first, i)
		if i < 6 {
			first = append(first, i) // enqueued twice at once
		}
	}

	proc, id, startedAt := start()
	enqueue(first...)
	figures := make([]killFigures, 0, kills)
	for k := range kills {
		if k%2 == 0 {
			waitUncommittedCharge(t, ctx, pool, startedAt)
		} else {
			// A worker just started (a -race binary) fetches and runs a job:
			// seconds on a loaded machine.
			oncetest.Eventually(t, 30*time.Second, "a job running in "+id, func() bool { return runningIn(t, ctx, pool, id) > 0 })
			time.Sleep(time.Duration(150+rand.IntN(450)) * time.Millisecond) // a random point of the job's run to kill at
		}
		require.NoError(t, proc.Cmd.Process.Kill()) // SIGKILL
		_ = proc.Cmd.Wait()
		figures = append(figures, killFigures{stranded: runningIn(t, ctx, pool, id), uncommitted: uncommitted(t, ctx, pool, startedAt)})
		proc, id, startedAt = start()
	}
	enqueue(6, 7, 8, 9, 10, 11) // enqueued again after the kills
	killed := time.Now()

	total := len(first) + 6
	oncetest.Eventually(t, 75*time.Second, "every job completed", func() bool {
		var done, failed int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'completed'),
			count(*) FILTER (WHERE state IN ('cancelled', 'discarded')) FROM river_job`).Scan(&done, &failed))
		require.Zero(t, failed, "a job was cancelled or discarded")
		return done == total
	})
	t.Logf("build %s, kills %s, then every job completed in %s", built.Sub(began).Round(time.Millisecond),
		killed.Sub(built).Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))

	count := func(query string, args ...any) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, query, args...).Scan(&n))
		return n
	}
	charges := count(`SELECT count(*) FROM gateway.charges WHERE status = 'succeeded'`)
	ledger := count(`SELECT count(*) FROM ledger`)
	rescued := count(`SELECT count(*) FROM river_job WHERE errors::text LIKE '%Stuck job rescued%'`)
	snoozes := count(`SELECT coalesce(sum((metadata->>'snoozes')::int), 0) FROM river_job`)
	resumed := 0
	for _, p := range procs {
		for line := range strings.Lines(p.Logs.String()) {
			if strings.Contains(line, "execution resumed") && strings.Contains(line, "outcome=executed") {
				resumed++
			}
		}
	}
	stranded, uncommittedAtKills := 0, 0
	for _, f := range figures {
		stranded += f.stranded
		uncommittedAtKills += f.uncommitted
	}
	t.Logf("%d jobs for %d orders, %d kills (%+v): %d jobs stranded, %d charges without their ledger row at the kills; "+
		"%d jobs rescued by River, %d snoozes, %d executions finished by a resumption; %d gateway charges, %d ledger rows",
		total, orders, kills, figures, stranded, uncommittedAtKills, rescued, snoozes, resumed, charges, ledger)

	require.Equal(t, orders, count(`SELECT count(*) FROM gateway.charges`), "one gateway charge per order, none left processing")
	require.Equal(t, orders, charges)
	require.Equal(t, orders, count(`SELECT count(DISTINCT reference) FROM gateway.charges`))
	require.Equal(t, orders, ledger, "one ledger row per charge")
	require.Equal(t, orders, count(`SELECT count(*) FROM ledger l JOIN gateway.charges c
		ON c.charge_id = l.charge_id AND c.reference = 'river/' || l.order_id AND c.amount = l.amount`), "each ledger row holds its order's charge")
	require.Positive(t, stranded, "the kills landed mid-job")
	require.Positive(t, uncommittedAtKills, "a kill landed between a charge and its ledger row")
	require.Positive(t, rescued, "River rescued the stranded jobs")
}

// runningIn counts the jobs running in River client id (its latest attempt).
func runningIn(t *testing.T, ctx context.Context, pool *pgxpool.Pool, id string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM river_job
		WHERE state = 'running' AND attempted_by[array_length(attempted_by, 1)] = $1`, id).Scan(&n))
	return n
}

// uncommitted counts the gateway charges made or under way from a moment
// on whose order has no ledger row yet.
func uncommitted(t *testing.T, ctx context.Context, pool *pgxpool.Pool, from time.Time) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM gateway.charges c
		WHERE c.created_at > $1 AND NOT EXISTS (SELECT 1 FROM ledger l WHERE 'river/' || l.order_id = c.reference)`, from).Scan(&n))
	return n
}

// waitUncommittedCharge waits until a charge made from a moment on (by the
// live worker) has no ledger row yet: the worker is between the charge and
// the commit.
func waitUncommittedCharge(t *testing.T, ctx context.Context, pool *pgxpool.Pool, from time.Time) {
	t.Helper()
	// The worker may have just started: seconds on a loaded machine before
	// it charges.
	oncetest.Eventually(t, 30*time.Second, "a charge without its ledger row", func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM gateway.charges c
			WHERE c.status <> 'processing' AND c.charged_at > $1
			AND NOT EXISTS (SELECT 1 FROM ledger l WHERE 'river/' || l.order_id = c.reference)`, from).Scan(&n))
		return n > 0
	})
}
