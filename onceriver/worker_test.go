package onceriver_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/demo/demotest"
	"github.com/onceonly/onceonly/demo/gateway"
	"github.com/onceonly/onceonly/onceriver"
	"github.com/onceonly/onceonly/onceriver/internal/chargejob"
)

// ledgerWorker returns a TxHandler worker writing one ledger row per run,
// counting its runs; before, if set, runs first in each run.
func ledgerWorker(t *testing.T, b *testBundle, runs *atomic.Int32, before func(ctx context.Context, job *river.Job[chargejob.Args]) error) *river.Workers {
	t.Helper()
	w, err := onceriver.NewTxWorker(b.engine, func(ctx context.Context, tx pgx.Tx, job *river.Job[chargejob.Args]) error {
		runs.Add(1)
		if before != nil {
			if err := before(ctx, job); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO ledger (order_id, charge_id, amount) VALUES ($1, $2, $3)`,
			job.Args.OrderID, "ch_"+job.Args.OrderID, job.Args.Amount)
		return err
	}, onceriver.Options[chargejob.Args]{})
	require.NoError(t, err)
	workers := river.NewWorkers()
	river.AddWorker(workers, w)
	return workers
}

func order(id string, amount int64) chargejob.Args {
	return chargejob.Args{OrderID: id, Amount: amount, Currency: "eur"}
}

// Three jobs carrying one logical message (same key, same args) and a job
// of another: the handler runs once per message, one ledger row each, every
// job completes, and the run that executed completed its job in the
// transaction that wrote the ledger row.
func TestDuplicateJobsRunOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var runs atomic.Int32
	client := b.start(t, ledgerWorker(t, b, &runs, nil))

	ids := b.insert(t, client, order("order-1", 100), order("order-1", 100), order("order-1", 100), order("order-2", 200))
	for _, row := range b.waitFinal(t, client, ids...) {
		require.Equal(t, rivertype.JobStateCompleted, row.State, "job %d: %+v", row.ID, row.Errors)
	}
	require.Equal(t, int32(2), runs.Load())
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM ledger WHERE order_id = 'order-1'`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM ledger WHERE order_id = 'order-2'`))
	same := 0
	for _, id := range ids[:3] {
		if b.sameTx(t, id, "order-1") {
			same++
		}
	}
	require.Equal(t, 1, same, "exactly one order-1 job completed in the ledger row's transaction")
	require.True(t, b.sameTx(t, ids[3], "order-2"))
}

// A job whose key another job holds is snoozed, not failed: no attempt is
// used and no error recorded. Once the holder commits, it completes as a
// replay.
func TestInFlightKeySnoozesTheJob(t *testing.T) {
	t.Parallel()
	// The first job's execution (one commit, no step) holds the key until
	// River fetched, ran and snoozed the second: seconds under load, past
	// the 2 s lease, when Postgres ends it and the second job finds the key
	// free. The test is of the snooze, not of leases: a lease longer than
	// its waits.
	b := setup(t, func(c *onceonly.Config) { c.LeaseTimeout = time.Minute })
	var runs atomic.Int32
	started, release := make(chan int64, 4), make(chan struct{})
	client := b.start(t, ledgerWorker(t, b, &runs, func(ctx context.Context, job *river.Job[chargejob.Args]) error {
		started <- job.ID
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}))
	snoozed, stop := client.Subscribe(river.EventKindJobSnoozed)
	defer stop()

	first := b.insert(t, client, order("order-s", 100))[0]
	require.Equal(t, first, <-started)
	second := b.insert(t, client, order("order-s", 100))[0]
	select {
	case ev := <-snoozed:
		require.Equal(t, second, ev.Job.ID)
	case <-time.After(10 * time.Second):
		t.Fatal("the second job was not snoozed")
	}
	row, err := client.JobGet(b.ctx, second)
	require.NoError(t, err)
	require.Empty(t, row.Errors, "a snooze records no error")
	require.Equal(t, 0, row.Attempt, "a snooze uses no attempt")
	close(release)

	for _, row := range b.waitFinal(t, client, first, second) {
		require.Equal(t, rivertype.JobStateCompleted, row.State, "job %d: %+v", row.ID, row.Errors)
	}
	require.Equal(t, int32(1), runs.Load())
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM ledger WHERE order_id = 'order-s'`))
	require.True(t, b.sameTx(t, first, "order-s"))
}

// A key used again with other args cancels the job: retrying cannot help.
func TestReusedKeyCancelsTheJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var runs atomic.Int32
	client := b.start(t, ledgerWorker(t, b, &runs, nil))

	first := b.insert(t, client, order("order-r", 100))[0]
	require.Equal(t, rivertype.JobStateCompleted, b.waitFinal(t, client, first)[0].State)
	second := b.insert(t, client, order("order-r", 999))[0]
	row := b.waitFinal(t, client, second)[0]
	require.Equal(t, rivertype.JobStateCancelled, row.State)
	require.NotEmpty(t, row.Errors)
	require.Contains(t, row.Errors[len(row.Errors)-1].Error, "idempotency key was used with another payload")
	require.Equal(t, int32(1), runs.Load())
	require.Equal(t, 100, b.count(t, `SELECT sum(amount) FROM ledger WHERE order_id = 'order-r'`))
}

// An empty key cancels the job without running the handler.
func TestInvalidKeyCancelsTheJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var runs atomic.Int32
	client := b.start(t, ledgerWorker(t, b, &runs, nil))

	row := b.waitFinal(t, client, b.insert(t, client, order("", 100))[0])[0]
	require.Equal(t, rivertype.JobStateCancelled, row.State)
	require.Contains(t, row.Errors[len(row.Errors)-1].Error, "idempotency key must be")
	require.Equal(t, int32(0), runs.Load())
}

// The handler's error goes back to River, which retries: its writes were
// rolled back, the key was failed, and the retry runs the handler again.
func TestHandlerErrorIsRetried(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var runs atomic.Int32
	client := b.start(t, ledgerWorker(t, b, &runs, func(context.Context, *river.Job[chargejob.Args]) error {
		if runs.Load() == 1 {
			return errors.New("downstream hiccup")
		}
		return nil
	}))

	id := b.insert(t, client, order("order-e", 100))[0]
	row := b.waitFinal(t, client, id)[0]
	require.Equal(t, rivertype.JobStateCompleted, row.State)
	require.Equal(t, 2, row.Attempt)
	require.Len(t, row.Errors, 1)
	require.Equal(t, "downstream hiccup", row.Errors[0].Error)
	require.Equal(t, int32(2), runs.Load())
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM ledger WHERE order_id = 'order-e'`))
	require.True(t, b.sameTx(t, id, "order-e"))
}

// A handler that keeps failing is retried by River, one attempt per failed
// run, until Policy.MaxFailures executions of its key failed: then the job
// is cancelled (dead-lettered, reason failed), its errors recorded. A job
// of the same key inserted later runs again.
func TestFailingHandlerIsCancelledAfterMaxFailures(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var runs atomic.Int32
	var healthy atomic.Bool
	w, err := onceriver.NewTxWorker(b.engine, func(ctx context.Context, tx pgx.Tx, job *river.Job[chargejob.Args]) error {
		runs.Add(1)
		if !healthy.Load() {
			return errors.New("downstream down")
		}
		_, err := tx.Exec(ctx, `INSERT INTO ledger (order_id, charge_id, amount) VALUES ($1, $2, $3)`,
			job.Args.OrderID, "ch_"+job.Args.OrderID, job.Args.Amount)
		return err
	}, onceriver.Options[chargejob.Args]{Policy: onceonly.SettlePolicy{MaxFailures: 3}})
	require.NoError(t, err)
	workers := river.NewWorkers()
	river.AddWorker(workers, w)
	client := b.start(t, workers)

	row := b.waitFinal(t, client, b.insert(t, client, order("order-f", 100))[0])[0]
	require.Equal(t, rivertype.JobStateCancelled, row.State)
	require.Equal(t, int32(3), runs.Load(), "three executions, three failures")
	require.Equal(t, 3, row.Attempt, "one River attempt per failed run")
	require.Len(t, row.Errors, 3)
	require.Equal(t, "downstream down", row.Errors[0].Error, "River records the handler's error as it returned it")
	require.Contains(t, row.Errors[2].Error, "failed: downstream down")
	require.Equal(t, 3, b.count(t, `SELECT failures FROM idempotency_keys WHERE key = 'order-f'`))
	require.Zero(t, b.count(t, `SELECT count(*) FROM ledger WHERE order_id = 'order-f'`))

	healthy.Store(true)
	row = b.waitFinal(t, client, b.insert(t, client, order("order-f", 100))[0])[0]
	require.Equal(t, rivertype.JobStateCompleted, row.State, "a later job of the key runs again: %+v", row.Errors)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM ledger WHERE order_id = 'order-f'`))
}

// A Handler with a step: duplicate jobs charge the gateway once per order,
// write one ledger row per charge, and the executing job completes in the
// ledger row's transaction.
func TestStepWorkerChargesOncePerOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	gw := demotest.Gateway(t, b.pool, gateway.Config{Latency: 50 * time.Millisecond})
	charge := chargejob.Handler(gw, 0)
	var withoutJob atomic.Int32
	w, err := onceriver.NewWorker(b.engine, func(ctx context.Context, args chargejob.Args) error {
		if _, ok := onceriver.JobFromContext(ctx); !ok {
			withoutJob.Add(1)
		}
		return charge(ctx, args)
	}, onceriver.Options[chargejob.Args]{})
	require.NoError(t, err)
	workers := river.NewWorkers()
	river.AddWorker(workers, w)
	client := b.start(t, workers)

	ids := b.insert(t, client, order("order-a", 100), order("order-a", 100), order("order-b", 200), order("order-a", 100))
	for _, row := range b.waitFinal(t, client, ids...) {
		require.Equal(t, rivertype.JobStateCompleted, row.State, "job %d: %+v", row.ID, row.Errors)
	}
	for _, o := range []string{"order-a", "order-b"} {
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM gateway.charges WHERE reference = $1`, chargejob.Reference(o)), o)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM ledger l JOIN gateway.charges c ON c.charge_id = l.charge_id
			WHERE l.order_id = $1 AND c.reference = $2`, o, chargejob.Reference(o)), o)
	}
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM ledger`))
	same := 0
	for _, id := range []int64{ids[0], ids[1], ids[3]} {
		if b.sameTx(t, id, "order-a") {
			same++
		}
	}
	require.Equal(t, 1, same)
	require.True(t, b.sameTx(t, ids[2], "order-b"))
	require.Equal(t, int32(0), withoutJob.Load(), "every run here is a River job's")
}

type unkeyed struct{ ID string }

func (unkeyed) Kind() string { return "unkeyed" }

// Args without a key need Options.Key; a handler name is registered once.
func TestNewWorkerChecksItsOptions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	noop := func(context.Context, unkeyed) error { return nil }
	_, err := onceriver.NewWorker(b.engine, noop, onceriver.Options[unkeyed]{})
	require.ErrorContains(t, err, "does not implement Keyed")
	_, err = onceriver.NewTxWorker(b.engine, func(context.Context, pgx.Tx, *river.Job[unkeyed]) error { return nil }, onceriver.Options[unkeyed]{})
	require.ErrorContains(t, err, "does not implement Keyed")

	byID := onceriver.Options[unkeyed]{Key: func(a unkeyed) string { return a.ID }}
	_, err = onceriver.NewWorker(b.engine, noop, byID)
	require.NoError(t, err)
	_, err = onceriver.NewWorker(b.engine, noop, byID)
	require.ErrorContains(t, err, `"river.unkeyed" is registered already`)
	byID.Name = "unkeyed.v2"
	_, err = onceriver.NewWorker(b.engine, noop, byID)
	require.NoError(t, err)
	_, err = onceriver.NewWorker[unkeyed](nil, noop, byID)
	require.Error(t, err)
}
