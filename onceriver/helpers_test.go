package onceriver_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/onceriver/internal/chargejob"
	"github.com/onceonly/onceonly/oncetest"
)

// TestMain fails the package's tests when a goroutine outlives them, and
// gives the runnable examples DATABASE_URL and REDIS_URL of their own.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(oncetest.WithExampleEnv(m, "onceriver"))
}

// migrateRiver creates River's tables in the database of pool.
func migrateRiver(ctx context.Context, pool *pgxpool.Pool) error {
	m, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: oncetest.QuietLogger()})
	if err != nil {
		return err
	}
	_, err = m.Migrate(ctx, rivermigrate.DirectionUp, nil)
	return err
}

type testBundle struct {
	ctx    context.Context
	pool   *pgxpool.Pool
	engine *onceonly.Engine
}

// setup gives a test a database with the engine's, River's and the
// ledger's tables, and an engine on it and the test Redis, configured
// further by configure.
func setup(t *testing.T, configure ...func(*onceonly.Config)) *testBundle {
	t.Helper()
	b := &testBundle{ctx: oncetest.Context(t), pool: oncetest.DB(t)}
	require.NoError(t, migrateRiver(b.ctx, b.pool))
	require.NoError(t, chargejob.Migrate(b.ctx, b.pool))
	rdb, prefix := oncetest.Redis(t)
	cfg := onceonly.Config{
		Pool: b.pool, Redis: rdb, RedisPrefix: prefix, LeaseTimeout: 2 * time.Second,
		ResumeInterval: 100 * time.Millisecond, Logger: oncetest.QuietLogger(),
	}
	for _, f := range configure {
		f(&cfg)
	}
	engine, err := onceonly.New(cfg)
	require.NoError(t, err)
	t.Cleanup(engine.Close)
	b.engine = engine
	return b
}

// fixedRetry retries every failed job after the same short delay.
type fixedRetry time.Duration

func (d fixedRetry) NextRetry(*rivertype.JobRow) time.Time { return time.Now().Add(time.Duration(d)) }

// start starts a River client working workers, stopped when the test ends.
func (b *testBundle) start(t *testing.T, workers *river.Workers) *river.Client[pgx.Tx] {
	t.Helper()
	client, err := river.NewClient(riverpgxv5.New(b.pool), &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}},
		Workers:           workers,
		RetryPolicy:       fixedRetry(100 * time.Millisecond),
		FetchCooldown:     20 * time.Millisecond,
		FetchPollInterval: 50 * time.Millisecond,
		TestOnly:          true,
		Logger:            oncetest.QuietLogger(),
	})
	require.NoError(t, err)
	require.NoError(t, client.Start(b.ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, client.Stop(ctx))
	})
	return client
}

// insert inserts one job per args and returns their IDs.
func (b *testBundle) insert(t *testing.T, client *river.Client[pgx.Tx], args ...river.JobArgs) []int64 {
	t.Helper()
	ids := make([]int64, 0, len(args))
	for _, a := range args {
		res, err := client.Insert(b.ctx, a, nil)
		require.NoError(t, err)
		ids = append(ids, res.Job.ID)
	}
	return ids
}

// finalStates are the states a job leaves no more.
var finalStates = []rivertype.JobState{rivertype.JobStateCompleted, rivertype.JobStateCancelled, rivertype.JobStateDiscarded}

// waitFinal waits until every job is completed, cancelled or discarded and
// returns their rows.
func (b *testBundle) waitFinal(t *testing.T, client *river.Client[pgx.Tx], ids ...int64) []*rivertype.JobRow {
	t.Helper()
	rows := make([]*rivertype.JobRow, len(ids))
	oncetest.Eventually(t, 20*time.Second, "jobs finished", func() bool {
		for i, id := range ids {
			row, err := client.JobGet(b.ctx, id)
			require.NoError(t, err)
			rows[i] = row
			if !slices.Contains(finalStates, row.State) {
				return false
			}
		}
		return true
	})
	return rows
}

// count runs a count query.
func (b *testBundle) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, query, args...).Scan(&n))
	return n
}

// sameTx reports whether the job's row and the order's ledger row were last
// written by one transaction (their xmin).
func (b *testBundle) sameTx(t *testing.T, jobID int64, orderID string) bool {
	t.Helper()
	var jobXmin, ledgerXmin string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT xmin::text FROM river_job WHERE id = $1`, jobID).Scan(&jobXmin))
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT xmin::text FROM ledger WHERE order_id = $1`, orderID).Scan(&ledgerXmin))
	return jobXmin == ledgerXmin
}
