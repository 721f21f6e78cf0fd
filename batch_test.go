package onceonly_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/oncetest"
)

// The tests of this file are of DoBatch: many deliveries, one transaction.

// keyedPayment is a batch item's handler that records one payment row for
// its key, and answers 201.
func keyedPayment(key string) onceonly.Handler {
	return func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
		if _, err := tx.Exec(ctx, `INSERT INTO payments (id, merchant_id, idempotency_key, amount, currency, customer, status)
			VALUES (gen_random_uuid()::text, 'm', $1, 100, 'usd', 'c', 'succeeded')`, key); err != nil {
			return onceonly.Result{}, err
		}
		return onceonly.Result{Status: 201, ContentType: "application/json", Body: []byte(`{"key":"` + key + `"}`)}, nil
	}
}

// batchOf returns n items with keys prefix0..prefix(n-1), each paying once.
func batchOf(prefix string, n int, payload string) []onceonly.BatchItem {
	items := make([]onceonly.BatchItem, n)
	for i := range items {
		key := prefix + strconv.Itoa(i)
		items[i] = onceonly.BatchItem{Scope: "s", Key: key, Payload: []byte(payload), Tx: keyedPayment(key)}
	}
	return items
}

// paymentsOf counts the payment rows of key.
func (b *testBundle) paymentsOf(t *testing.T, key string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM payments WHERE idempotency_key = $1`, key).Scan(&n))
	return n
}

// TestBatchRunsOnceAndReplays: a batch runs each of its keys once, in one
// commit that writes every key's row, completed at version 1, with one
// outbox event each; the same batch again is answered by replays, without
// running a handler; a key sent again with another payload is refused.
func TestBatchRunsOnceAndReplays(t *testing.T) {
	t.Parallel()
	for _, noRedis := range []bool{false, true} {
		t.Run(fmt.Sprintf("noRedis=%v", noRedis), func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{noRedis: noRedis})
			e := b.singleEngine(t, 0)
			items := batchOf("k", 20, "p")
			for i, r := range e.DoBatch(b.ctx, items) {
				require.NoError(t, r.Err, i)
				require.False(t, r.Outcome.Replayed)
				require.Equal(t, 201, r.Outcome.Status)
				require.JSONEq(t, `{"key":"k`+strconv.Itoa(i)+`"}`, string(r.Outcome.Body))
			}
			require.Equal(t, 20, b.payments(t))
			var keys, versions, events int
			require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*), sum(version), (SELECT count(*) FROM outbox)
				FROM idempotency_keys WHERE status = 'completed'`).Scan(&keys, &versions, &events))
			require.Equal(t, 20, keys)
			require.Equal(t, 20, versions, "every key at version 1")
			require.Equal(t, 20, events)

			for i, r := range e.DoBatch(b.ctx, items) {
				require.NoError(t, r.Err, i)
				require.True(t, r.Outcome.Replayed, i)
				require.JSONEq(t, `{"key":"k`+strconv.Itoa(i)+`"}`, string(r.Outcome.Body))
			}
			reused := batchOf("k", 3, "other")
			for i, r := range e.DoBatch(b.ctx, reused) {
				require.ErrorIs(t, r.Err, onceonly.ErrKeyReused, i)
			}
			require.Equal(t, 20, b.payments(t), "no replay or reused key ran a handler")
		})
	}
}

// TestBatchFailureAndPanicRollBackTheirOwn: a message whose handler fails,
// panics or answers a status that is not stored rolls back its own writes
// and leaves its key failed, one failure counted, while the others of the
// batch commit; a retry runs the failed keys again.
func TestBatchFailureAndPanicRollBackTheirOwn(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	e := b.singleEngine(t, 0)
	boom := errors.New("boom")
	failing := func(key string, how string) onceonly.Handler {
		pay := keyedPayment(key)
		return func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
			if _, err := pay(ctx, tx); err != nil {
				return onceonly.Result{}, err
			}
			switch how {
			case "error":
				return onceonly.Result{}, boom
			case "panic":
				panic("handler bug")
			case "sql":
				_, err := tx.Exec(ctx, `SELECT 1/0`) // the transaction is aborted until the savepoint
				return onceonly.Result{}, err
			}
			return onceonly.Result{Status: 503}, nil
		}
	}
	items := batchOf("ok", 4, "p")
	for _, how := range []string{"error", "panic", "sql", "503"} {
		items = append(items, onceonly.BatchItem{Scope: "s", Key: how, Payload: []byte("p"), Tx: failing(how, how)})
	}
	items = append(items, batchOf("more", 2, "p")...)
	results := e.DoBatch(b.ctx, items)
	for i, r := range results {
		switch key := items[i].Key; key {
		case "error", "panic", "sql":
			var ee *onceonly.ExecutionError
			require.ErrorAs(t, r.Err, &ee, key)
			require.Equal(t, 1, ee.Failures, key)
			require.Equal(t, "failed", b.keyStatus(t, key))
			require.Zero(t, b.paymentsOf(t, key), key)
		case "503":
			require.NoError(t, r.Err)
			require.Equal(t, 503, r.Outcome.Status)
			require.Equal(t, "failed", b.keyStatus(t, key))
			require.Zero(t, b.paymentsOf(t, key))
		default:
			require.NoError(t, r.Err, key)
			require.Equal(t, "completed", b.keyStatus(t, key))
			require.Equal(t, 1, b.paymentsOf(t, key), key)
		}
	}
	require.ErrorIs(t, results[4].Err, boom)
	require.ErrorIs(t, results[5].Err, onceonly.ErrHandlerPanicked)

	retry := []onceonly.BatchItem{
		{Scope: "s", Key: "error", Payload: []byte("p"), Tx: keyedPayment("error")},
		{Scope: "s", Key: "panic", Payload: []byte("p"), Tx: keyedPayment("panic")},
		{Scope: "s", Key: "ok0", Payload: []byte("p"), Tx: keyedPayment("ok0")},
	}
	for i, r := range e.DoBatch(b.ctx, retry) {
		require.NoError(t, r.Err, i)
		require.Equal(t, i == 2, r.Outcome.Replayed, i)
		require.Equal(t, 1, b.paymentsOf(t, retry[i].Key))
	}
}

// TestBatchDuplicateKeysRunOnce: a key twice in one batch runs once; the
// second copy is answered after the first committed: a replay with the
// same payload, a reused key with another.
func TestBatchDuplicateKeysRunOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	e := b.singleEngine(t, 0)
	items := []onceonly.BatchItem{
		{Scope: "s", Key: "a", Payload: []byte("p"), Tx: keyedPayment("a")},
		{Scope: "s", Key: "a", Payload: []byte("p"), Tx: keyedPayment("a")},
		{Scope: "s", Key: "b", Payload: []byte("p"), Tx: keyedPayment("b")},
		{Scope: "s", Key: "a", Payload: []byte("other"), Tx: keyedPayment("a")},
		{Scope: "s", Key: "a", Payload: []byte("p"), Tx: keyedPayment("a")},
	}
	results := e.DoBatch(b.ctx, items)
	require.NoError(t, results[0].Err)
	require.False(t, results[0].Outcome.Replayed)
	require.NoError(t, results[1].Err)
	require.True(t, results[1].Outcome.Replayed)
	require.NoError(t, results[2].Err)
	require.ErrorIs(t, results[3].Err, onceonly.ErrKeyReused)
	require.True(t, results[4].Outcome.Replayed)
	require.Equal(t, 1, b.paymentsOf(t, "a"))
	require.Equal(t, 1, b.paymentsOf(t, "b"))
}

// TestBatchStepRunsAlone: Step inside a batch is refused before it calls
// out (ErrStepInBatch); the item's writes are rolled back and it runs
// again alone, where its step runs once and its key completes; the other
// items commit in the batch.
func TestBatchStepRunsAlone(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	e := b.singleEngine(t, 0)
	var calls, refused atomic.Int32
	charge := func(ctx context.Context, x *onceonly.Execution) (onceonly.Result, error) {
		_, err := onceonly.Step(ctx, "gateway", func(context.Context, string) (int, error) { return int(calls.Add(1)), nil })
		if errors.Is(err, onceonly.ErrStepInBatch) {
			refused.Add(1)
			return onceonly.Result{}, err
		}
		if err != nil {
			return onceonly.Result{}, err
		}
		tx, err := x.Tx(ctx)
		if err != nil {
			return onceonly.Result{}, err
		}
		return keyedPayment(x.Key())(ctx, tx)
	}
	require.NoError(t, e.Register("charge", charge))
	items := append(batchOf("plain", 3, "p"), onceonly.BatchItem{Scope: "s", Key: "stepper", Payload: []byte("p"), Func: charge, Name: "charge"})
	for i, r := range e.DoBatch(b.ctx, items) {
		require.NoError(t, r.Err, i)
		require.False(t, r.Outcome.Replayed, i)
	}
	require.Equal(t, int32(1), refused.Load())
	require.Equal(t, int32(1), calls.Load(), "the refused step never called out")
	require.Equal(t, "completed", b.keyStatus(t, "stepper"))
	require.Equal(t, 1, b.paymentsOf(t, "stepper"))
	require.Equal(t, 4, b.payments(t))
}

// TestBatchAndSingleNeverRunAtOnce hammers batches and single executions
// of the same keys at once: a handler of a key never runs while another of
// the same key does (no concurrent execution), and each key's effect
// commits once (exactly once).
func TestBatchAndSingleNeverRunAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	e := b.singleEngine(t, 0)
	const rounds, keys, singles = 60, 8, 3
	var (
		mu      sync.Mutex
		running = map[string]int{}
		overlap atomic.Int32
	)
	guarded := func(key string) onceonly.Handler {
		pay := keyedPayment(key)
		return func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
			mu.Lock()
			running[key]++
			if running[key] > 1 {
				overlap.Add(1)
			}
			mu.Unlock()
			defer func() {
				mu.Lock()
				running[key]--
				mu.Unlock()
			}()
			// Two statements: the handler stays in its key's window a
			// round trip longer.
			if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock_shared(42)`); err != nil {
				return onceonly.Result{}, err
			}
			return pay(ctx, tx)
		}
	}
	for round := range rounds {
		items := make([]onceonly.BatchItem, keys)
		for i := range items {
			key := fmt.Sprintf("r%d-%d", round, i)
			items[i] = onceonly.BatchItem{Scope: "s", Key: key, Payload: []byte("p"), Tx: guarded(key)}
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		wg.Go(func() {
			<-start
			for _, r := range e.DoBatch(b.ctx, items) {
				if r.Err != nil {
					var inFlight *onceonly.InFlightError
					require.ErrorAs(t, r.Err, &inFlight)
				}
			}
		})
		for s := range singles {
			wg.Go(func() {
				<-start
				for i := range keys {
					it := items[(i+s)%keys]
					_, err := e.Do(b.ctx, it.Scope, it.Key, it.Payload, it.Tx)
					if err != nil {
						var inFlight *onceonly.InFlightError
						require.ErrorAs(t, err, &inFlight)
					}
				}
			})
		}
		close(start)
		wg.Wait()
	}
	require.Zero(t, overlap.Load(), "a key's handler ran beside another of the same key")
	var doubled int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM (SELECT idempotency_key FROM payments
		GROUP BY idempotency_key HAVING count(*) > 1) d`).Scan(&doubled))
	require.Zero(t, doubled, "a key's effect committed twice")
	var orphans int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM payments p WHERE NOT EXISTS
		(SELECT FROM idempotency_keys k WHERE k.key = p.idempotency_key AND k.status = 'completed')`).Scan(&orphans))
	require.Zero(t, orphans, "an effect committed without its key completed")
}

// TestBatchWhenRedisGoes: a batch runs on when its Redis is flushed or
// stopped: Postgres answers the replays and the reused keys, and first
// executions go on, each once.
func TestBatchWhenRedisGoes(t *testing.T) {
	t.Parallel()
	srv := oncetest.NewRedisServer(t)
	rdb := oncetest.RedisClient(t, srv.URL())
	b := setup(t, setupOpts{rdb: rdb})
	e := b.singleEngine(t, 0)
	for _, r := range e.DoBatch(b.ctx, batchOf("k", 8, "p")) {
		require.NoError(t, r.Err)
	}
	require.NoError(t, rdb.FlushAll(b.ctx).Err())
	for _, r := range e.DoBatch(b.ctx, batchOf("k", 8, "p")) {
		require.NoError(t, r.Err)
		require.True(t, r.Outcome.Replayed, "replayed from Postgres")
	}

	srv.Stop()
	items := append(batchOf("k", 4, "p"), batchOf("new", 4, "p")...)
	items = append(items, batchOf("k", 6, "other")[5])
	for i, r := range e.DoBatch(b.ctx, items) {
		switch {
		case i < 4:
			require.NoError(t, r.Err, i)
			require.True(t, r.Outcome.Replayed, i)
		case i < 8:
			require.NoError(t, r.Err, "first executions go on without Redis")
			require.False(t, r.Outcome.Replayed, i)
		default:
			require.ErrorIs(t, r.Err, onceonly.ErrKeyReused)
		}
	}
	require.Equal(t, 12, b.payments(t))
}

// TestBatchOneHandlerCannotSinkTheOthers: a handler that swallows a failed
// statement fails its own key only; one that leaves the batch's
// connection unusable (rows it never closed) fails the batch's
// transaction, and every delivery of it runs again alone, each once.
func TestBatchOneHandlerCannotSinkTheOthers(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	e := b.singleEngine(t, 0)
	swallow := func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
		_, _ = tx.Exec(ctx, `SELECT 1/0`)
		return onceonly.Result{Status: 201}, nil
	}
	items := append(batchOf("a", 3, "p"), onceonly.BatchItem{Scope: "s", Key: "swallow", Payload: []byte("p"), Tx: swallow})
	for i, r := range e.DoBatch(b.ctx, items) {
		if items[i].Key == "swallow" {
			require.Error(t, r.Err)
			require.Equal(t, "failed", b.keyStatus(t, "swallow"))
			continue
		}
		require.NoError(t, r.Err, i)
		require.Equal(t, 1, b.paymentsOf(t, items[i].Key))
	}

	var opened atomic.Int32
	leaveRows := func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
		if opened.Add(1) == 1 {
			_, err := tx.Query(ctx, `SELECT generate_series(1, 100000)`) //nolint:sqlclosecheck // the bug under test
			if err != nil {
				return onceonly.Result{}, err
			}
			return onceonly.Result{}, errors.New("left its rows open")
		}
		return keyedPayment("rows")(ctx, tx)
	}
	items = append(batchOf("b", 3, "p"), onceonly.BatchItem{Scope: "s", Key: "rows", Payload: []byte("p"), Tx: leaveRows})
	for i, r := range e.DoBatch(b.ctx, items) {
		require.NoError(t, r.Err, items[i].Key)
		require.Equal(t, 1, b.paymentsOf(t, items[i].Key), items[i].Key)
	}
	require.Equal(t, int32(2), opened.Load(), "the batch, then alone")
}
