package onceonly_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
)

// chargeKey is a handler that records one payment for key and answers with
// the key, so an answer shows which execution it came from.
func chargeKey(key string) onceonly.Handler {
	return func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
		if _, err := tx.Exec(ctx, `INSERT INTO payments (id, merchant_id, idempotency_key, amount, currency, customer, status)
			VALUES (gen_random_uuid()::text, 'm', $1, 100, 'usd', 'c', 'succeeded')`, key); err != nil {
			return onceonly.Result{}, err
		}
		return onceonly.Result{Status: 201, Body: []byte(key)}, nil
	}
}

// doUntilAnswered runs Do for key until it is answered (a duplicate in
// flight gets 409 meanwhile) and returns the answer's body.
func doUntilAnswered(ctx context.Context, e *onceonly.Engine, key string) (string, error) {
	for {
		out, err := e.Do(ctx, "tenant", key, []byte("p"), chargeKey(key))
		if _, inFlight := onceonly.IsInFlight(err); inFlight {
			time.Sleep(5 * time.Millisecond) // a client's pause before it retries, not a wait for an event
			continue
		}
		return string(out.Body), err
	}
}

// Claims of concurrent executions share statements. Without Redis, every
// copy of a key reaches Postgres, three at once: each key runs once, every
// answer is its own key's, and the claims went in fewer statements than
// there were claims.
func TestClaimBatchingHammer(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noRedis: true})
	const keys, copies, workers = 150, 3, 32
	todo := make([]string, 0, keys*copies)
	for k := range keys {
		for range copies {
			todo = append(todo, fmt.Sprintf("hammer-%d", k))
		}
	}
	rand.Shuffle(len(todo), func(i, j int) { todo[i], todo[j] = todo[j], todo[i] })
	work := make(chan string, len(todo))
	for _, key := range todo {
		work <- key
	}
	close(work)
	var wg sync.WaitGroup
	errs := make(chan error, len(todo))
	for range workers {
		wg.Go(func() {
			for key := range work {
				body, err := doUntilAnswered(b.ctx, b.engine, key)
				switch {
				case err != nil:
					errs <- fmt.Errorf("%s: %w", key, err)
				case body != key:
					errs <- fmt.Errorf("%s: answered with the body of %s", key, body)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	var twice, charged int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*), count(*) FILTER (WHERE n > 1)
		FROM (SELECT idempotency_key, count(*) AS n FROM payments GROUP BY 1) p`).Scan(&charged, &twice))
	require.Equal(t, keys, charged)
	require.Zero(t, twice, "keys charged more than once")

	batches, claims := b.histogram(t, "onceonly_claim_batch_size")
	require.Positive(t, batches)
	require.Less(t, batches, claims, "claims shared statements")
	t.Logf("%d claims in %d statements", int(claims), int(batches))
}

// A transaction that claimed a key and stays open (a DoTx whose caller is
// slow to commit) holds the key's lock: a claim of the same key is turned
// away at once (409) instead of waiting in Postgres, and the claims of
// other keys, batched beside it, are answered long before that transaction
// ends.
func TestClaimBatchDoesNotWaitOnAnOpenTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noRedis: true})
	const held = 5 * time.Second
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	_, err = b.engine.DoTx(b.ctx, tx, "tenant", "open", []byte("p"), chargeKey("open"))
	require.NoError(t, err)
	// The transaction stays open until the other keys are answered, or for
	// held at most.
	answered := make(chan struct{})
	go func() {
		select {
		case <-answered:
		case <-time.After(held):
		}
		_ = tx.Commit(context.WithoutCancel(b.ctx))
	}()

	began := time.Now()
	_, err = b.engine.Do(b.ctx, "tenant", "open", []byte("p"), chargeKey("open"))
	require.True(t, isInFlight(err), "the key of the open transaction: %v", err)
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Go(func() {
			key := fmt.Sprintf("free-%d", i)
			body, err := doUntilAnswered(b.ctx, b.engine, key)
			assertf(t, err == nil && body == key, "%s: %q, %v", key, body, err)
		})
	}
	wg.Wait()
	took := time.Since(began)
	close(answered)
	require.Less(t, took, held/2, "the other keys waited for the open transaction")
}

// assertf reports a failure from any goroutine.
func assertf(t *testing.T, ok bool, format string, args ...any) {
	t.Helper()
	if !ok {
		t.Errorf(format, args...)
	}
}

// histogram returns the sample count and sum of the histogram name.
func (b *testBundle) histogram(t *testing.T, name string) (count, sum float64) {
	t.Helper()
	mfs, err := b.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				count += float64(m.GetHistogram().GetSampleCount())
				sum += m.GetHistogram().GetSampleSum()
			}
		}
	}
	return count, sum
}
